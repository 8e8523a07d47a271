//! The connection guard: a middleware that keeps a request's body from holding a connection
//! open.
//!
//! Two holes in actix-http 3's HTTP/1 dispatcher make it necessary:
//! - a body is read only as fast as the client sends it, with no deadline once the head has
//!   arrived (`client_request_timeout` covers the head only), so a body that never arrives holds
//!   its handler, and the connection, forever;
//! - after a response to a request whose chunked body was never read (a 401, a 404…), the
//!   dispatcher keeps the connection to drain the rest of that body, with no timer, so an
//!   unterminated chunked body holds the connection forever. It closes the connection instead
//!   (after a 1 s linger) when the body's reader is still alive as the response goes out.
//!
//! So the guard gives every request that declares a body a reader with a deadline
//! (`server.request_timeout_ms` from the head's arrival: past it, reading fails and the JSON
//! extractor answers 408), keeps that reader alive until the response has been written, and
//! marks the response `Connection: close` whenever the body was not read to its end.
//!
//! The deadline's timer is armed only when the reader has to wait for the body. A small body
//! usually arrives with the head, but actix calls the handler before it hands over the body it
//! has already read, so the first read always waits: that first time the reader asks to be
//! polled again instead (it would be anyway, as the body is handed over), and arms the timer
//! only if the body is still missing then. Registering and cancelling a timer for every request
//! had cost an acquire about 1.4 % of its time.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{forward_ready, Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::error::PayloadError;
use actix_web::http::{header, ConnectionType};
use actix_web::web::Bytes;
use actix_web::{Error, HttpMessage};
use futures_util::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

/// The body's deadline passed before its end arrived. Carried inside the payload's I/O error, so
/// that the body extractor can answer 408 instead of 400.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline {
    pub limit_ms: u64,
}

impl fmt::Display for BodyDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} ms",
            self.limit_ms
        )
    }
}

impl std::error::Error for BodyDeadline {}

impl BodyDeadline {
    /// The deadline that made a payload read fail, if that is why it failed.
    pub fn of(error: &PayloadError) -> Option<BodyDeadline> {
        match error {
            PayloadError::Io(io) => io.get_ref()?.downcast_ref::<BodyDeadline>().copied(),
            _ => None,
        }
    }
}

/// The middleware; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Guard {
    request_timeout: Duration,
}

impl Guard {
    pub fn new(request_timeout: Duration) -> Self {
        Self { request_timeout }
    }
}

impl<S, B> Transform<S, ServiceRequest> for Guard
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<HeldBody>;
    type Error = Error;
    type Transform = GuardService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(GuardService {
            service,
            request_timeout: self.request_timeout,
        }))
    }
}

pub struct GuardService<S> {
    service: S,
    request_timeout: Duration,
}

/// The request's own body reader, shared by the handler's stream and the response.
struct Body {
    payload: RefCell<Payload>,
    finished: Cell<bool>,
}

impl<S, B> Service<ServiceRequest> for GuardService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<HeldBody>;
    type Error = Error;
    type Future = Guarded<S::Future>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        if !declares_body(&req) {
            return Guarded {
                answer: self.service.call(req),
                body: None,
            };
        }
        let body = Rc::new(Body {
            payload: RefCell::new(req.take_payload()),
            finished: Cell::new(false),
        });
        let stream = DeadlineStream {
            body: Some(body.clone()),
            deadline: Instant::now() + self.request_timeout,
            timer: Timer::NotWaited,
            limit_ms: u64::try_from(self.request_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        req.set_payload(Payload::Stream {
            payload: Box::pin(stream),
        });
        Guarded {
            answer: self.service.call(req),
            body: Some(body),
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer to a request, its body holding the request's body reader (when it has one).
    pub struct Guarded<F> {
        #[pin]
        answer: F,
        body: Option<Rc<Body>>,
    }
}

impl<F, B> Future for Guarded<F>
where
    F: Future<Output = Result<ServiceResponse<B>, Error>>,
    B: MessageBody + 'static,
{
    type Output = Result<ServiceResponse<HeldBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.answer.poll(cx))?;
        let body = this.body.take();
        Poll::Ready(Ok(res.map_body(|head, inner| {
            if body.as_ref().is_some_and(|b| !b.finished.get()) {
                head.set_connection_type(ConnectionType::Close);
            }
            HeldBody {
                body: inner.boxed(),
                _request_body: body,
            }
        })))
    }
}

/// Whether the request announced a body (a chunked one, or a positive `Content-Length`).
fn declares_body(req: &ServiceRequest) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

/// The request body as the handler reads it: the real one until the deadline, then an error.
struct DeadlineStream {
    /// `None` once the stream has ended, by the body's end or by the deadline.
    body: Option<Rc<Body>>,
    deadline: Instant,
    timer: Timer,
    limit_ms: u64,
}

/// The deadline's timer, armed the second time the reader has to wait.
enum Timer {
    NotWaited,
    WaitedOnce,
    Armed(Pin<Box<Sleep>>),
}

impl Stream for DeadlineStream {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(body) = self.body.clone() else {
            return Poll::Ready(None);
        };
        let next = body.payload.borrow_mut().poll_next_unpin(cx);
        match next {
            Poll::Ready(None) => {
                body.finished.set(true);
                self.body = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
            Poll::Pending => {
                if let Timer::NotWaited = self.timer {
                    // See the module documentation: the body is usually on its way.
                    self.timer = Timer::WaitedOnce;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                if let Timer::WaitedOnce = self.timer {
                    let sleep = tokio::time::sleep_until(self.deadline);
                    self.timer = Timer::Armed(Box::pin(sleep));
                }
                if let Timer::Armed(timer) = &mut self.timer {
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                self.body = None;
                let error = BodyDeadline {
                    limit_ms: self.limit_ms,
                };
                Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    error,
                )))))
            }
        }
    }
}

/// A response body that keeps the request's body reader alive until the response has been
/// written: actix closes a connection whose unread body still has a reader, and drains one whose
/// reader is gone (forever, if the body never ends).
pub struct HeldBody {
    body: BoxBody,
    _request_body: Option<Rc<Body>>,
}

impl MessageBody for HeldBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.body).poll_next(cx)
    }
}
