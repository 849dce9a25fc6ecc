//! How a relayed connection ends: the graceful GOAWAY, a lost runtime connection, a connection error, the client gone.

use super::*;

/// How far the graceful GOAWAY has gone.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    Open,
    /// GOAWAY(2^31 − 1) and the PING sent; waiting for its ACK.
    Pinged,
    /// The final GOAWAY sent: streams above this one are not served.
    Final(u32),
}

impl Core {
    /// Shutdown: graceful GOAWAY; the connection ends once its calls have ([`Core::finished`]).
    pub fn stop(&mut self) {
        self.stopping = true;
        self.begin_close();
    }

    /// The runtime connection broke (`why`, for the statuses): calls on it end `UNAVAILABLE`,
    /// new ones are taken over (see the module docs).
    pub fn backend_lost(&mut self, why: String) {
        if !self.connected {
            return;
        }
        let _ = self.decode_undecoded();
        self.connected = false;
        tracing::warn!(backend = %self.runtime.path().display(), error = %why, "backend connection broken");
        self.runtime.connection_lost();
        self.to_backend.clear();
        self.held_heads = 0;
        self.backend.input.clear();
        self.backend.block = None;
        self.backend.held = None;
        // The relay is the client's peer from now on: SETTINGS if the runtime's never came, the
        // held DATA's credit back, and the client's connection window as a fresh peer's.
        if !self.backend_settings {
            frame::settings(&mut self.to_client, &[(setting::MAX_CONCURRENT_STREAMS, self.max_streams)]);
        }
        // The client's SETTINGS the runtime did not acknowledge (to the client) are the relay's
        // to acknowledge now.
        for _ in 0..std::mem::take(&mut self.client_settings_unacked) {
            frame::settings_ack(&mut self.to_client);
        }
        if let Some((head, _)) = self.client.held.take() {
            self.backend.window.room += head.len as i64;
        }
        let client_view = self.backend.window.room + self.backend.window.debt as i64;
        if client_view < frame::DEFAULT_WINDOW {
            frame::window_update(&mut self.to_client, 0, (frame::DEFAULT_WINDOW - client_view) as u32);
        }
        self.backend.window = Window { room: frame::DEFAULT_WINDOW.max(client_view), debt: 0 };
        let on_it: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| !matches!(s.kind, StreamKind::TakenOver(_)))
            .map(|(id, _)| *id)
            .collect();
        for id in on_it {
            let method = self.streams.get(&id).map(|s| s.method.clone()).unwrap_or_default();
            let status = Status::new(Code::UNAVAILABLE, format!("{method}: {} failed the call: {why}", self.runtime));
            self.fail(id, status);
        }
        self.gone = Some(format!("{} failed: {why}", self.runtime));
        self.flush_pending();
    }

    /// Graceful GOAWAY, first step (the second when the client acknowledges the PING).
    pub(super) fn begin_close(&mut self) {
        if self.closing != Closing::Open {
            return;
        }
        frame::goaway(&mut self.to_client, 0x7fff_ffff, reason::NO_ERROR);
        frame::ping(&mut self.to_client, false, &CLOSING_PING);
        self.closing = Closing::Pinged;
    }

    pub(super) fn fatal(&mut self, code: u32, why: &'static str) {
        tracing::debug!(error = why, "client connection error; closing it");
        frame::goaway(&mut self.to_client, self.last_stream, code);
        self.closing = Closing::Final(self.last_stream);
        self.done = true;
    }

    pub(super) fn client_gone(&mut self) {
        self.done = true;
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(stream) = self.streams.get_mut(&id) {
                match &mut stream.kind {
                    StreamKind::Relayed { .. } => self.end_stream(id, Status::new(Code::CANCELLED, "client went away")),
                    StreamKind::Intercepted(i) => i.task.cancel(),
                    StreamKind::TakenOver(t) => t.task.cancel(),
                }
            }
        }
        self.streams.clear();
    }

    /// After the connection (whose last turn wrote what it could): calls still open are
    /// recorded as cancelled, their tasks told.
    pub fn finish(&mut self) {
        self.client_gone();
        self.after_write();
    }
}
