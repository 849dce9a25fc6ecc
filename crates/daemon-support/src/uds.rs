//! A unix stream socket for HTTP/2 connections that is registered with the reactor for
//! **readability only**: runtime-proxy's client, runtime and hook connections, and the
//! connections runtime-hooks serves.
//!
//! Why: tokio registers its `UnixStream` for readable and writable events (edge-triggered).
//! On a unix socket the kernel signals "writable" every time the peer *reads* what we wrote
//! (`unix_write_space`), so each call woke the proxy up twice more than needed: once when the
//! backend had read the request and once when the client had read the answer — an `epoll_wait`
//! and usually a context switch each, for nothing to do (measured: docs/benchmarks.md) — and it
//! woke runtime-hooks once per hook call, when the proxy read its answer. Writes
//! almost never find the socket buffer full, so this type writes directly and only when a write
//! would block registers a duplicate of the descriptor for writability (`dup(2)`: epoll keys on
//! the descriptor, so both registrations coexist), dropping it again once a write goes through
//! whole.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A connected unix stream socket, readable-only registration (see the module docs).
pub struct Socket {
    fd: AsyncFd<OwnedFd>,
    /// A duplicate registered for writability, only while writes find the buffer full.
    writable: Option<AsyncFd<OwnedFd>>,
}

impl Socket {
    /// Takes over a tokio unix stream (which stays non-blocking).
    ///
    /// Errors: the stream cannot be deregistered or the descriptor registered again.
    pub fn new(stream: tokio::net::UnixStream) -> io::Result<Socket> {
        let fd = OwnedFd::from(stream.into_std()?);
        Ok(Socket { fd: register(fd, Interest::READABLE)?, writable: None })
    }
}

fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open for as long as it lives and always returns the same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

fn cvt(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `sendmsg(2)` of `bufs` with `MSG_NOSIGNAL` (a peer gone is an error, not SIGPIPE).
fn send(fd: &OwnedFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    loop {
        // SAFETY: msghdr zeroed is valid (no name, no control data); the iovecs point into
        // `bufs` (IoSlice is ABI-compatible with iovec) which outlive the call.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = bufs.len().min(1024) as _;
            cvt(libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL))
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // SAFETY: read(2) only writes into the unfilled part, and we only mark as filled
            // what it reports written.
            let unfilled = unsafe { buf.unfilled_mut() };
            let len = unfilled.len();
            let read = guard.try_io(|fd| loop {
                match cvt(unsafe { libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), len) }) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => return r,
                }
            });
            match read {
                Ok(Ok(n)) => {
                    // A short read drained the socket: wait for the next edge rather than
                    // calling read(2) once more only to get EAGAIN (as tokio's own streams do).
                    if n > 0 && n < len {
                        guard.clear_ready();
                    }
                    // SAFETY: read(2) initialised these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            if let Some(w) = &this.writable {
                let mut guard = ready!(w.poll_write_ready(cx))?;
                match guard.try_io(|fd| send(fd.get_ref(), bufs)) {
                    Ok(Ok(n)) => {
                        if n == want {
                            this.writable = None;
                        }
                        return Poll::Ready(Ok(n));
                    }
                    Ok(Err(e)) => return Poll::Ready(Err(e)),
                    Err(_would_block) => continue,
                }
            }
            match send(this.fd.get_ref(), bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let dup = this.fd.get_ref().try_clone()?;
                    this.writable = Some(register(dup, Interest::WRITABLE)?);
                }
                r => return Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: shutdown(2) on a descriptor we own.
        match unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) } {
            0 => Poll::Ready(Ok(())),
            _ => {
                let e = io::Error::last_os_error();
                // Already disconnected: nothing left to shut down.
                if e.raw_os_error() == Some(libc::ENOTCONN) {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Ready(Err(e))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn round_trip_and_backpressure() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut a, mut b) = (Socket::new(a).unwrap(), Socket::new(b).unwrap());
        a.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        // Far more than the socket buffer holds: the writer must wait for the reader.
        let big: Vec<u8> = (0..8 << 20).map(|i| i as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&sent).await.unwrap();
            a.shutdown().await.unwrap();
        });
        let mut all = Vec::new();
        b.read_to_end(&mut all).await.unwrap();
        writer.await.unwrap();
        assert_eq!(all.len(), big.len());
        assert!(all == big);
    }
}
