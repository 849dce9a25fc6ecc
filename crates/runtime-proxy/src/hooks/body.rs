//! Reading an intercepted request's body whole, under `--max-request-bytes` and
//! `--request-idle-timeout` ([`crate::hooks::limits::Limits`]). Each front end feeds it its own chunks
//! ([`Chunks`]) and answers its errors ([`BodyError`]) in its own shape: a gRPC status in CRI
//! mode, a Docker error answer in Docker mode.

use std::future::Future;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

/// A request body as a front end receives it: chunks in order, `None` after the last.
pub trait Chunks: Send {
    /// Why the client's stream broke.
    type Error: Send;
    /// The next chunk (`Ok` with no bytes for a part of the body that carries none, such as
    /// HTTP/1 trailers); `None` once the body is complete.
    fn next_chunk(&mut self) -> impl Future<Output = Option<Result<Bytes, Self::Error>>> + Send;
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum BodyError<E> {
    /// More than `max` bytes (`--max-request-bytes`).
    TooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    /// No chunk for this long (`--request-idle-timeout`).
    Stalled(Duration),
    /// The client's stream broke.
    Broken(E),
}

/// Reads `body` whole: at most `max` bytes, with no gap longer than `idle` between chunks.
///
/// Errors: [`BodyError`], the first bound crossed or the stream's own error.
pub async fn read_whole<C: Chunks>(body: &mut C, max: usize, idle: Duration) -> Result<Bytes, BodyError<C::Error>> {
    let mut buf = BytesMut::new();
    loop {
        let next = tokio::time::timeout(idle, body.next_chunk()).await.map_err(|_| BodyError::Stalled(idle))?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(BodyError::Broken)?;
        if buf.len() + chunk.len() > max {
            return Err(BodyError::TooLarge { max });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}
