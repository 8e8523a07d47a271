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

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{forward_ready, Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::error::PayloadError;
use actix_web::http::{header, ConnectionType};
use actix_web::web::Bytes;
use actix_web::{Error, HttpMessage};
use futures_util::future::LocalBoxFuture;
use futures_util::{Stream, StreamExt};
use tokio::time::Sleep;

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
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        if !declares_body(&req) {
            let answer = self.service.call(req);
            return Box::pin(async move {
                let res = answer.await?;
                Ok(res.map_body(|_, body| HeldBody {
                    body: body.boxed(),
                    _request_body: None,
                }))
            });
        }
        let body = Rc::new(Body {
            payload: RefCell::new(req.take_payload()),
            finished: Cell::new(false),
        });
        let limit_ms = u64::try_from(self.request_timeout.as_millis()).unwrap_or(u64::MAX);
        let stream = DeadlineStream {
            body: Some(body.clone()),
            deadline: Box::pin(tokio::time::sleep(self.request_timeout)),
            limit_ms,
        };
        req.set_payload(Payload::Stream {
            payload: Box::pin(stream),
        });
        let answer = self.service.call(req);
        Box::pin(async move {
            let res = answer.await?;
            Ok(res.map_body(|head, inner| {
                if !body.finished.get() {
                    head.set_connection_type(ConnectionType::Close);
                }
                HeldBody {
                    body: inner.boxed(),
                    _request_body: Some(body),
                }
            }))
        })
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
    deadline: Pin<Box<Sleep>>,
    limit_ms: u64,
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
                if self.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
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
