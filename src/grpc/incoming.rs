//! The gRPC listener's connections, bounded: at most `max_connections` are open at once (each
//! holds a permit until its socket is closed), and each must finish its HTTP/2 handshake (the
//! client's preface and first SETTINGS frame, which a client sends as soon as it connects) within
//! a deadline, or is closed. At the cap, the oldest connection still waiting for its handshake is
//! closed to make room for the next one, so a flood of connections that say nothing cannot keep
//! out a client that speaks; without such a connection, the next one waits in the listen queue,
//! as the HTTP side's do at theirs.
//!
//! With TLS (`grpc.tls_cert_file`), the TLS handshake comes first, under the same slot and
//! within the same deadline, and runs beside the accept loop (one task per connection), so a
//! client that says nothing holds one slot until its deadline and blocks no other accept; a
//! connection in its TLS handshake may be closed to make room like one in its HTTP/2 handshake.
//!
//! What happens after the handshake is hyper's (keepalive pings, stream limits) and tonic's
//! (the per-call deadline), set up in `grpc::serve`.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The client's connection preface (RFC 9113, section 3.4), which its SETTINGS frame follows.
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header: a 24-bit length, a type, flags and a stream id.
const FRAME_HEADER_LEN: usize = 9;

/// Accepted connections in their handshake, oldest first, and the permits of open ones.
struct Slots {
    permits: Arc<Semaphore>,
    handshaking: Mutex<VecDeque<Weak<Conn>>>,
    /// Told when a connection becomes one that may be closed to make room.
    evictable: Notify,
}

/// A connection's standing, shared between its socket and the accept loop.
struct Conn {
    state: AtomicU8,
    /// Its task's waker, to close it from the accept loop.
    waker: Mutex<Option<Waker>>,
    /// Told when it is closed to make room (a connection in its TLS handshake waits on this).
    closed: Notify,
}

/// Accepted, not yet read from: its handshake may already be waiting in the socket.
const ACCEPTED: u8 = 0;
/// Read from, and its handshake is not all there: may be closed to make room.
const WAITING: u8 = 1;
/// Handshake complete (or connection closed): never closed to make room.
const DONE: u8 = 2;
/// Closed to make room: its next read fails.
const EVICTED: u8 = 3;

/// The connections `listener` accepts, at most `max_connections` open at once, each closed
/// unless its handshake (TLS first, with `tls`) arrives within `handshake_timeout`.
pub fn bounded(
    listener: TcpListener,
    max_connections: usize,
    handshake_timeout: Duration,
    tls: Option<TlsAcceptor>,
) -> impl Stream<Item = io::Result<Guarded>> {
    let slots = Arc::new(Slots {
        permits: Arc::new(Semaphore::new(max_connections.max(1))),
        handshaking: Mutex::new(VecDeque::new()),
        evictable: Notify::new(),
    });
    match tls {
        None => {
            futures_util::stream::unfold((listener, slots), move |(listener, slots)| async move {
                let next = slots
                    .next(&listener, handshake_timeout)
                    .await
                    .map(Admitted::plain);
                Some((next, (listener, slots)))
            })
            .left_stream()
        }
        Some(acceptor) => tls_stream(listener, slots, handshake_timeout, acceptor).right_stream(),
    }
}

/// Accepts on a task of its own, each TLS handshake on a task of its own, and yields the
/// connections whose handshake succeeded; the tasks end when the stream is dropped.
fn tls_stream(
    listener: TcpListener,
    slots: Arc<Slots>,
    handshake_timeout: Duration,
    acceptor: TlsAcceptor,
) -> impl Stream<Item = io::Result<Guarded>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Guarded>();
    tokio::spawn(async move {
        loop {
            let admitted = tokio::select! {
                () = tx.closed() => return,
                admitted = slots.next(&listener, handshake_timeout) => admitted,
            };
            let Ok(admitted) = admitted else { return };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                // Evictable from the start: a TLS client that says nothing is what eviction is for.
                admitted.conn.state.store(WAITING, Ordering::Release);
                admitted.slots.evictable.notify_one();
                let conn = admitted.conn.clone();
                let deadline = admitted.deadline;
                let closed = conn.closed.notified();
                let (stream, rest) = admitted.split();
                let handshake = tokio::select! {
                    () = closed => {
                        tracing::debug!("a gRPC connection in its TLS handshake was closed to make room");
                        return;
                    }
                    done = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => done,
                };
                match handshake {
                    Ok(Ok(tls)) => {
                        if conn.state.load(Ordering::Acquire) != EVICTED {
                            let _ = tx.send(rest.with(Io::Tls(Box::new(tls))));
                        }
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "a gRPC connection's TLS handshake failed");
                        metrics::counter!(crate::metrics::GRPC_CONNECTIONS_CLOSED, "reason" => "tls_handshake_failed")
                            .increment(1);
                    }
                    Err(_) => {
                        tracing::debug!(
                            "a gRPC connection did not finish its TLS handshake in time"
                        );
                        metrics::counter!(crate::metrics::GRPC_CONNECTIONS_CLOSED, "reason" => "handshake_timeout")
                            .increment(1);
                    }
                }
            });
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        let next = rx.recv().await?;
        Some((Ok(next), rx))
    })
}

/// A connection accepted with a slot, before its handshake.
struct Admitted {
    stream: TcpStream,
    deadline: Instant,
    conn: Arc<Conn>,
    slots: Arc<Slots>,
    permit: OwnedSemaphorePermit,
}

/// An [`Admitted`] without its socket, while the TLS handshake has that.
struct Rest {
    deadline: Instant,
    conn: Arc<Conn>,
    slots: Arc<Slots>,
    permit: OwnedSemaphorePermit,
}

impl Admitted {
    fn plain(self) -> Guarded {
        let (stream, rest) = self.split();
        rest.with(Io::Plain(stream))
    }

    fn split(self) -> (TcpStream, Rest) {
        (
            self.stream,
            Rest {
                deadline: self.deadline,
                conn: self.conn,
                slots: self.slots,
                permit: self.permit,
            },
        )
    }
}

impl Rest {
    fn with(self, stream: Io) -> Guarded {
        Guarded {
            stream,
            handshake: Handshake::default(),
            deadline: Some(Box::pin(tokio::time::sleep_until(self.deadline))),
            conn: self.conn,
            slots: self.slots,
            _permit: self.permit,
        }
    }
}

/// A connection's socket, in plaintext or under TLS.
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Slots {
    /// The next connection with a slot of its own. The connection is accepted before its slot
    /// is found, so the listener holds at most one descriptor beyond `max_connections`.
    async fn next(
        self: &Arc<Self>,
        listener: &TcpListener,
        deadline: Duration,
    ) -> io::Result<Admitted> {
        let stream = loop {
            match listener.accept().await {
                Ok((stream, _)) => break stream,
                Err(error) => {
                    // Out of descriptors (EMFILE) or a connection reset while queued: retrying
                    // at once would spin.
                    tracing::warn!(%error, "gRPC accept failed; retrying in 50 ms");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let permit = loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                break permit;
            }
            if self.evict_oldest() {
                tracing::debug!(
                    "gRPC connections at their cap: closed the oldest one still in its handshake"
                );
                metrics::counter!(crate::metrics::GRPC_CONNECTIONS_CLOSED, "reason" => "evicted")
                    .increment(1);
            }
            tokio::select! {
                permit = self.permits.clone().acquire_owned() => match permit {
                    Ok(permit) => break permit,
                    Err(_) => return Err(io::Error::other("the gRPC listener's slots were closed")),
                },
                () = self.evictable.notified() => {}
            }
        };
        let conn = Arc::new(Conn {
            state: AtomicU8::new(ACCEPTED),
            waker: Mutex::new(None),
            closed: Notify::new(),
        });
        if let Ok(mut queue) = self.handshaking.lock() {
            // Entries of connections done with their handshake are dropped from the front; the
            // handshake deadline keeps any one from staying at the front for long.
            while queue.front().is_some_and(|c| {
                c.upgrade()
                    .is_none_or(|c| c.state.load(Ordering::Acquire) >= DONE)
            }) {
                queue.pop_front();
            }
            queue.push_back(Arc::downgrade(&conn));
        }
        Ok(Admitted {
            stream,
            deadline: Instant::now() + deadline,
            conn,
            slots: self.clone(),
            permit,
        })
    }

    /// Closes the oldest connection still waiting for its handshake; false when there is none.
    fn evict_oldest(&self) -> bool {
        let Ok(mut queue) = self.handshaking.lock() else {
            return false;
        };
        let mut i = 0;
        while i < queue.len() {
            let Some(conn) = queue[i].upgrade() else {
                queue.remove(i);
                continue;
            };
            match conn
                .state
                .compare_exchange(WAITING, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    queue.remove(i);
                    conn.closed.notify_one();
                    if let Some(waker) = conn.waker.lock().ok().and_then(|mut w| w.take()) {
                        waker.wake();
                    }
                    return true;
                }
                Err(ACCEPTED) => i += 1,
                Err(_) => {
                    queue.remove(i);
                }
            }
        }
        false
    }
}

/// How much of the client's preface and first frame has arrived.
#[derive(Default)]
struct Handshake {
    seen: usize,
    /// The first frame's 24-bit length, as its bytes arrive.
    length: [u8; 3],
}

impl Handshake {
    /// Counts `bytes`, just read; true once the preface and the whole first frame are in.
    fn read(&mut self, bytes: &[u8]) -> bool {
        for (i, b) in bytes.iter().enumerate() {
            let at = self.seen + i;
            if (PREFACE_LEN..PREFACE_LEN + 3).contains(&at) {
                self.length[at - PREFACE_LEN] = *b;
            }
        }
        self.seen += bytes.len();
        self.complete()
    }

    fn complete(&self) -> bool {
        let header_end = PREFACE_LEN + FRAME_HEADER_LEN;
        if self.seen < header_end {
            return false;
        }
        let [a, b, c] = self.length;
        let length = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
        self.seen >= header_end + length
    }
}

/// An accepted connection holding its slot until it is dropped, closed if its handshake does
/// not arrive in time or the accept loop needs its slot first.
pub struct Guarded {
    stream: Io,
    handshake: Handshake,
    /// Until the handshake is complete.
    deadline: Option<Pin<Box<Sleep>>>,
    conn: Arc<Conn>,
    slots: Arc<Slots>,
    _permit: OwnedSemaphorePermit,
}

impl Guarded {
    fn finish_handshake(&mut self) {
        self.deadline = None;
        self.conn.state.store(DONE, Ordering::Release);
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.conn.state.store(DONE, Ordering::Release);
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(deadline) = this.deadline.as_mut() else {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        };
        if this.conn.state.load(Ordering::Acquire) == EVICTED {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "closed to make room: its HTTP/2 handshake had not arrived",
            )));
        }
        if deadline.as_mut().poll(cx).is_ready() {
            tracing::debug!("a gRPC connection did not finish its HTTP/2 handshake in time");
            metrics::counter!(crate::metrics::GRPC_CONNECTIONS_CLOSED, "reason" => "handshake_timeout")
                .increment(1);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the HTTP/2 handshake did not arrive in time (grpc.handshake_timeout_ms)",
            )));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) => {
                if this.handshake.read(&buf.filled()[before..]) {
                    this.finish_handshake();
                }
            }
            Poll::Pending => {
                // The waker first: the accept loop wakes whoever it finds there once it has
                // marked the connection evicted.
                if let Ok(mut waker) = this.conn.waker.lock() {
                    *waker = Some(cx.waker().clone());
                }
                if this
                    .conn
                    .state
                    .compare_exchange(ACCEPTED, WAITING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    this.slots.evictable.notify_one();
                }
            }
            Poll::Ready(Err(_)) => {}
        }
        read
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.tcp().connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    #[test]
    fn the_handshake_is_the_preface_and_the_whole_first_frame() {
        let settings: &[u8] = &[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let mut whole = PREFACE.to_vec();
        whole.extend_from_slice(settings);
        // Arriving in one piece, or a byte at a time.
        assert!(Handshake::default().read(&whole));
        let mut h = Handshake::default();
        for (i, b) in whole.iter().enumerate() {
            assert_eq!(h.read(&[*b]), i + 1 == whole.len(), "after {} bytes", i + 1);
        }
        // The preface alone, or with part of its frame, is not a handshake.
        assert!(!Handshake::default().read(PREFACE));
        assert!(!Handshake::default().read(&whole[..whole.len() - 1]));
        // An empty SETTINGS frame is a whole frame.
        let mut empty = PREFACE.to_vec();
        empty.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert!(Handshake::default().read(&empty));
    }
}
