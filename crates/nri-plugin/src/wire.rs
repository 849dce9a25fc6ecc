//! NRI's transport, by hand: ttrpc messages over logical connections multiplexed on the one
//! plugin socket.
//!
//! * **Multiplexing** (NRI `pkg/net/multiplex`): the socket carries frames of an 8-byte header
//!   — connection ID u32 BE, payload length u32 BE (at most 16 MiB) — and the payload. ID 1
//!   ([`PLUGIN_CONN`]) carries the `Plugin` service, which the runtime calls and the plugin
//!   serves; ID 2 ([`RUNTIME_CONN`]) the `Runtime` service, which the plugin calls. Opening a
//!   connection sends nothing: both ends just use the IDs.
//! * **ttrpc** on each logical connection, a byte stream: a 10-byte header — payload length u32
//!   BE (at most 4 MiB), stream ID u32 BE (odd: client-initiated), type u8 (1 request, 2
//!   response), flags u8 (a unary request carries 0x1, "remote closed") — and a protobuf
//!   `ttrpc.Request` or `ttrpc.Response` (`proto/nri/ttrpc.proto`).
//!
//! The receiving side reassembles each connection's frames into one byte stream, so it does
//! not care how the peer cut them. The sending side writes each ttrpc message as frames of at
//! most 4096 bytes, all under one lock (messages never interleave): the Go side reads a frame
//! whole into a `bufio.Reader` of 4096 bytes (a longer frame there is `ENOMEM` unless it lands
//! directly in a large read), so short frames are what it always accepts.

use std::collections::HashMap;
use std::io;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

use crate::proto::ttrpc;

/// Logical connection of the `Plugin` service (runtime → plugin).
pub const PLUGIN_CONN: u32 = 1;
/// Logical connection of the `Runtime` service (plugin → runtime).
pub const RUNTIME_CONN: u32 = 2;

/// ttrpc message type: request.
pub const REQUEST: u8 = 1;
/// ttrpc message type: response.
pub const RESPONSE: u8 = 2;
/// ttrpc flag of a unary request: the client sends nothing more on the stream.
pub const FLAG_REMOTE_CLOSED: u8 = 1;

const MUX_HEADER: usize = 8;
const TTRPC_HEADER: usize = 10;
/// Largest multiplexer frame the peer accepts (NRI `maxPayloadSize`).
const MAX_MUX_PAYLOAD: usize = 1 << 24;
/// Largest ttrpc message (ttrpc `messageLengthMax`).
pub const MAX_MESSAGE: usize = 4 << 20;
/// Frame size we send (see the module documentation).
const SEND_FRAME: usize = 4096;

/// One ttrpc message received on a logical connection.
#[derive(Debug)]
pub struct Received {
    /// The logical connection ([`PLUGIN_CONN`], [`RUNTIME_CONN`], or another).
    pub conn: u32,
    /// ttrpc stream ID.
    pub stream: u32,
    /// ttrpc message type.
    pub kind: u8,
    /// ttrpc flags.
    pub flags: u8,
    /// The protobuf payload (`ttrpc.Request` or `ttrpc.Response`).
    pub payload: Vec<u8>,
}

/// The writing half: whole ttrpc messages, one at a time.
pub struct Sender {
    half: Mutex<OwnedWriteHalf>,
}

impl Sender {
    /// Wraps the socket's writing half.
    pub fn new(half: OwnedWriteHalf) -> Sender {
        Sender { half: Mutex::new(half) }
    }

    /// Sends one ttrpc message on logical connection `conn`.
    ///
    /// Errors: the socket's; `InvalidInput` for a payload above 4 MiB.
    pub async fn send(&self, conn: u32, stream: u32, kind: u8, flags: u8, payload: &[u8]) -> io::Result<()> {
        let bytes = encode(conn, stream, kind, flags, payload)?;
        let mut half = self.half.lock().await;
        half.write_all(&bytes).await?;
        half.flush().await
    }

    /// Sends a `ttrpc.Response` for `stream` on [`PLUGIN_CONN`].
    pub async fn respond(&self, stream: u32, response: &ttrpc::Response) -> io::Result<()> {
        self.send(PLUGIN_CONN, stream, RESPONSE, 0, &response.encode_to_vec()).await
    }

    /// Closes the writing side (the peer sees EOF).
    pub async fn shutdown(&self) {
        let _ = self.half.lock().await.shutdown().await;
    }
}

/// A ttrpc message as multiplexer frames of at most `SEND_FRAME` (4096) bytes each.
pub fn encode(conn: u32, stream: u32, kind: u8, flags: u8, payload: &[u8]) -> io::Result<Vec<u8>> {
    if payload.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("ttrpc message of {} bytes (at most {MAX_MESSAGE})", payload.len()),
        ));
    }
    let mut message = Vec::with_capacity(TTRPC_HEADER + payload.len());
    message.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    message.extend_from_slice(&stream.to_be_bytes());
    message.extend_from_slice(&[kind, flags]);
    message.extend_from_slice(payload);
    let mut out = Vec::with_capacity(message.len() + MUX_HEADER * (message.len() / SEND_FRAME + 1));
    for chunk in message.chunks(SEND_FRAME) {
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    Ok(out)
}

/// Reassembles logical connections' byte streams into ttrpc messages.
#[derive(Default)]
pub struct Demux {
    streams: HashMap<u32, Vec<u8>>,
}

impl Demux {
    /// Adds a frame's payload for `conn`.
    pub fn push(&mut self, conn: u32, payload: &[u8]) {
        self.streams.entry(conn).or_default().extend_from_slice(payload);
    }

    /// The next complete message of any connection, if one is there.
    ///
    /// Errors: `InvalidData` for a message above 4 MiB (the stream cannot be trusted after it).
    pub fn pop(&mut self) -> io::Result<Option<Received>> {
        for (&conn, buf) in self.streams.iter_mut() {
            if buf.len() < TTRPC_HEADER {
                continue;
            }
            let len = u32::from_be_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
            if len > MAX_MESSAGE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("ttrpc message of {len} bytes on connection {conn}"),
                ));
            }
            if buf.len() < TTRPC_HEADER + len {
                continue;
            }
            let stream = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes"));
            let (kind, flags) = (buf[8], buf[9]);
            let payload = buf[TTRPC_HEADER..TTRPC_HEADER + len].to_vec();
            buf.drain(..TTRPC_HEADER + len);
            return Ok(Some(Received { conn, stream, kind, flags, payload }));
        }
        Ok(None)
    }
}

/// The reading half: multiplexer frames in, ttrpc messages out.
pub struct Receiver {
    half: OwnedReadHalf,
    demux: Demux,
}

impl Receiver {
    /// Wraps the socket's reading half.
    pub fn new(half: OwnedReadHalf) -> Receiver {
        Receiver { half, demux: Demux::default() }
    }

    /// The next ttrpc message.
    ///
    /// Errors: the socket's (`UnexpectedEof` when the runtime closed it), `InvalidData` for
    /// frames or messages above the protocol's limits.
    pub async fn next(&mut self) -> io::Result<Received> {
        loop {
            if let Some(m) = self.demux.pop()? {
                return Ok(m);
            }
            let mut header = [0u8; MUX_HEADER];
            self.half.read_exact(&mut header).await?;
            let conn = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
            if len > MAX_MUX_PAYLOAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("multiplexer frame of {len} bytes")));
            }
            let mut payload = vec![0u8; len];
            self.half.read_exact(&mut payload).await?;
            self.demux.push(conn, &payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits encoded frames back into (conn, payload) pairs.
    fn frames(mut bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let conn = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
            let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) as usize;
            out.push((conn, bytes[8..8 + len].to_vec()));
            bytes = &bytes[8 + len..];
        }
        out
    }

    #[test]
    fn encodes_the_header_and_small_frames() {
        let bytes = encode(2, 1, REQUEST, FLAG_REMOTE_CLOSED, b"abc").unwrap();
        assert_eq!(bytes, [&[0, 0, 0, 2, 0, 0, 0, 13][..], &[0, 0, 0, 3, 0, 0, 0, 1, 1, 1], b"abc"].concat());
        let big = vec![7u8; 10_000];
        let f = frames(&encode(1, 3, RESPONSE, 0, &big).unwrap());
        assert_eq!(f.iter().map(|(_, p)| p.len()).collect::<Vec<_>>(), [4096, 4096, 1818]);
        assert!(f.iter().all(|(c, _)| *c == 1));
        assert!(encode(1, 1, REQUEST, 0, &vec![0; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn reassembles_messages_cut_anywhere_and_interleaved() {
        let a = encode(1, 1, REQUEST, 1, &vec![1u8; 5000]).unwrap();
        let b = encode(2, 1, RESPONSE, 0, b"ok").unwrap();
        let mut d = Demux::default();
        // Feed conn 1's stream a byte at a time, with conn 2's message in the middle.
        let fa = frames(&a);
        let joined: Vec<u8> = fa.iter().flat_map(|(_, p)| p.clone()).collect();
        for (i, byte) in joined.iter().enumerate() {
            if i == 100 {
                for (c, p) in frames(&b) {
                    d.push(c, &p);
                }
                let m = d.pop().unwrap().expect("conn 2's message is complete");
                assert_eq!((m.conn, m.stream, m.kind, m.payload.as_slice()), (2, 1, RESPONSE, &b"ok"[..]));
            }
            assert!(d.pop().unwrap().is_none(), "incomplete at byte {i}");
            d.push(1, std::slice::from_ref(byte));
        }
        let m = d.pop().unwrap().unwrap();
        assert_eq!((m.conn, m.stream, m.kind, m.flags, m.payload.len()), (1, 1, REQUEST, 1, 5000));
        assert!(d.pop().unwrap().is_none());
        d.push(1, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 1, 0]);
        assert!(d.pop().is_err(), "a message above 4 MiB");
    }
}
