//! Flow control: each peer's connection window as the relay sends to it, frames held for room, WINDOW_UPDATEs read
//! ahead of them, and the frame walk both sides share.

use super::*;

/// Connection-level credit for request bodies the relay took (intercepted calls) that may wait
/// for the next bytes written to the client anyway: a quarter of HTTP/2's default window
/// (65,535 bytes), so the client always has most of its window.
pub const CREDIT_BATCH: u32 = (frame::DEFAULT_WINDOW / 4) as u32;

/// A peer's connection-level flow-control window, as the relay sends to it.
pub(super) struct Window {
    /// Room left (bytes): what the peer granted minus what it was sent.
    pub(super) room: i64,
    /// DATA bytes the relay sent the peer of its own, whose credit (the peer's WINDOW_UPDATEs
    /// for them) must not reach the other peer.
    pub(super) debt: u64,
}

impl Default for Window {
    fn default() -> Self {
        Window { room: frame::DEFAULT_WINDOW, debt: 0 }
    }
}

impl Window {
    /// The peer granted `increment` more: returns what of it is the other peer's (to forward).
    pub(super) fn granted(&mut self, increment: u32) -> u32 {
        self.room += i64::from(increment);
        let held = self.debt.min(u64::from(increment));
        self.debt -= held;
        increment - held as u32
    }
}

/// The frame at `at` in `input`, and where it ends, when it is there whole.
pub(super) fn whole_frame(input: &[u8], at: usize) -> Option<(Head, usize)> {
    if input.len() - at < HEAD_LEN {
        return None;
    }
    let head = Head::parse(&input[at..]);
    let end = at + HEAD_LEN + head.len;
    (input.len() >= end).then_some((head, end))
}

/// Where the header block of `stream` whose first frame ends at `at` ends: after the
/// CONTINUATION with END_HEADERS; `None` while it is incomplete, or when another frame
/// interrupts it.
pub(super) fn block_end(input: &[u8], mut at: usize, stream: u32) -> Option<usize> {
    loop {
        let (head, end) = whole_frame(input, at)?;
        if head.kind != kind::CONTINUATION || head.stream != stream {
            return None;
        }
        if head.has(flag::END_HEADERS) {
            return Some(end);
        }
        at = end;
    }
}

/// A SETTINGS_MAX_FRAME_SIZE value within what RFC 9113 allows (16 KiB to 16 MiB − 1; a peer
/// that sends another breaks the protocol, and is read as the nearest bound).
pub(super) fn frame_size(value: u32) -> usize {
    value.clamp(frame::DEFAULT_MAX_FRAME as u32, (1 << 24) - 1) as usize
}

/// A WINDOW_UPDATE's increment.
///
/// Errors: FRAME_SIZE_ERROR for a payload that is not 4 bytes.
pub(super) fn increment(head: &Head, raw: &[u8]) -> Result<u32, Fatal> {
    if head.len != 4 {
        return Err(Fatal(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
    }
    Ok(u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) & 0x7fff_ffff)
}

impl Core {
    /// Handles the whole frames at the front of one side's input, where they lie (no copy per
    /// frame): the input is taken for the loop and given back without what was handled. Stops
    /// at a frame held back for want of window, and when that side can take no more (the
    /// connection over, the runtime connection lost).
    ///
    /// Errors: a frame larger than the receiver's SETTINGS_MAX_FRAME_SIZE, or the frame
    /// handler's.
    pub(super) fn frames(&mut self, from: Side) -> Result<(), Fatal> {
        let (mut input, max_frame) = match from {
            Side::Client => (std::mem::take(&mut self.client.input), self.backend.max_frame),
            Side::Backend => {
                (std::mem::take(&mut self.backend.input), self.client.max_frame.max(frame::DEFAULT_MAX_FRAME))
            }
        };
        let mut at = 0;
        let result = loop {
            let stopped = match from {
                Side::Client => self.done,
                Side::Backend => !self.connected,
            };
            if stopped || input.len() - at < HEAD_LEN {
                break Ok(());
            }
            if self.held(from) {
                match self.window_updates_ahead(from, &mut input, at) {
                    Ok(()) if self.held(from) => break Ok(()),
                    Ok(()) => continue,
                    Err(e) => break Err(e),
                }
            }
            let head = Head::parse(&input[at..]);
            if head.len > max_frame {
                break Err(Fatal(reason::FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE"));
            }
            let end = at + HEAD_LEN + head.len;
            if input.len() < end {
                input.reserve(end - input.len());
                break Ok(());
            }
            let handled = match from {
                Side::Client => self.client_frame(head, &input[at..end]),
                Side::Backend => self.backend_frame(head, &input[at..end]),
            };
            at = end;
            if handled.is_err() {
                break handled;
            }
        };
        input.advance(at);
        match from {
            Side::Client => self.client.input = input,
            // Once the runtime connection is lost, what it sent is dropped with it.
            Side::Backend if self.connected => self.backend.input = input,
            Side::Backend => {}
        }
        result
    }

    /// Whether a DATA frame from `from` waits for the other peer's connection window.
    pub(super) fn held(&self, from: Side) -> bool {
        match from {
            Side::Client => self.client.held.is_some(),
            Side::Backend => self.backend.held.is_some(),
        }
    }

    /// While a frame from `from` is held, the connection-level WINDOW_UPDATEs queued behind it
    /// (in `input`, from `at`) are taken out and applied now. The held frame waits for the
    /// other peer's credit, which may itself wait behind a frame of the other peer's that the
    /// relay holds for *this* peer's credit — a WINDOW_UPDATE in this queue: taken in order,
    /// neither would ever come. A connection-level WINDOW_UPDATE only adds credit for the other
    /// direction, so where it arrives among the sender's other frames does not matter to the
    /// receiver (RFC 9113 §6.9; stream-level ones stay in order, as SETTINGS may change stream
    /// windows). A header block is passed over whole, never taken a frame out of (a frame
    /// inside it is a protocol error, found when the block's turn comes); the look stops at an
    /// incomplete frame or block, or a malformed one, and goes on from there with the next read
    /// (`client.scanned`, `backend.scanned`), until the held frame went on or the connection ends.
    pub(super) fn window_updates_ahead(&mut self, from: Side, input: &mut BytesMut, at: usize) -> Result<(), Fatal> {
        let mut scan = at
            + match from {
                Side::Client => self.client.scanned,
                Side::Backend => self.backend.scanned,
            };
        let result = loop {
            let stopped = match from {
                Side::Client => self.done,
                Side::Backend => !self.connected,
            };
            if stopped || !self.held(from) {
                break Ok(());
            }
            let Some((head, end)) = whole_frame(input, scan) else { break Ok(()) };
            if matches!(head.kind, kind::HEADERS | kind::PUSH_PROMISE) && !head.has(flag::END_HEADERS) {
                match block_end(input, end, head.stream) {
                    Some(block_end) => scan = block_end,
                    None => break Ok(()),
                }
                continue;
            }
            if head.kind != kind::WINDOW_UPDATE || head.stream != 0 {
                scan = end;
                continue;
            }
            let mut raw = [0u8; HEAD_LEN + 4];
            let Some(frame) = raw.get_mut(..end - scan) else {
                break Err(Fatal(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
            };
            frame.copy_from_slice(&input[scan..end]);
            let tail = input.split_off(end);
            input.truncate(scan);
            input.unsplit(tail);
            let handled = match from {
                Side::Client => self.client_frame(head, frame),
                Side::Backend => self.backend_frame(head, frame),
            };
            if handled.is_err() {
                break handled;
            }
        };
        match from {
            Side::Client => self.client.scanned = scan - at,
            Side::Backend => self.backend.scanned = scan - at,
        }
        result
    }
}
