//! The stream table: each call in flight (relayed, intercepted or taken over), its deadline, and how it ends.

use super::*;

/// One call in flight.
pub(super) struct Stream {
    pub(super) method: Box<str>,
    pub(super) start: Instant,
    /// The response head went to the client.
    pub(super) head_sent: bool,
    pub(super) kind: StreamKind,
}

pub(super) enum StreamKind {
    /// Forwarded as it is; `deadline`: the caller's (`grpc-timeout`), enforced until the head.
    Relayed {
        deadline: Option<Instant>,
    },
    Intercepted(Box<Intercepted>),
    TakenOver(Box<TakenOver>),
}

/// The relay's side of a call's task: where its request body goes.
pub(super) struct Task {
    /// Where the body goes; `None` once it ended (or the task stopped taking it).
    pub(super) body: Option<mpsc::UnboundedSender<Result<Bytes, Status>>>,
    /// Sent to when the client reset the call or went away (dropped unsent otherwise).
    pub(super) cancel: Option<oneshot::Sender<()>>,
    /// The client sent END_STREAM.
    pub(super) client_done: bool,
}

pub(super) struct Intercepted {
    pub(super) task: Task,
    /// The body to send on, as far as not yet sent.
    pub(super) outgoing: Option<Bytes>,
    /// Room in the runtime's window for this stream.
    pub(super) window: i64,
    /// Where the answer goes, once whole.
    pub(super) answer: Option<oneshot::Sender<Result<Answer, Status>>>,
    /// The interceptor handed the body back (the pre stage is done).
    pub(super) sent: bool,
    /// The client's END_STREAM already went to the runtime (on its HEADERS, or on trailers,
    /// which go on at once): nothing can follow it, the body is not sent.
    pub(super) upstream_closed: bool,
    /// The answer so far, as relayed to the client.
    pub(super) head: Option<Response<()>>,
    pub(super) data: BytesMut,
    /// The answer was too long to copy whole ([`ANSWER_COPY_LIMIT`]).
    pub(super) data_cut: bool,
    /// The caller's deadline (`grpc-timeout`), enforced once the body went on, until the head.
    pub(super) deadline: Option<Instant>,
    /// What the runtime answered before the pre stage was done (an encoding it does not
    /// take, say), held for the client until it is: frames, and the whole answer.
    pub(super) early: BytesMut,
    pub(super) early_answer: Option<Result<Answer, Status>>,
}

pub(super) struct TakenOver {
    pub(super) task: Task,
    /// Room in the client's window for this stream.
    pub(super) window: i64,
    /// The answer, as far as it is not written yet.
    pub(super) reply: Option<PendingReply>,
    /// The answer was written whole.
    pub(super) replied: bool,
}

pub(super) struct PendingReply {
    pub(super) head: Option<BytesMut>,
    pub(super) data: Bytes,
    pub(super) trailers: Option<BytesMut>,
}

impl Task {
    /// Tells the task the client reset the call (or went away).
    pub(super) fn cancel(&mut self) {
        self.body = None;
        if let Some(c) = self.cancel.take() {
            let _ = c.send(());
        }
    }
}

impl Intercepted {
    /// Hands the answer to the task, if it waits for one.
    pub(super) fn answered(&mut self, answer: Result<Answer, Status>) {
        if let Some(tx) = self.answer.take() {
            let _ = tx.send(answer);
        }
    }
}

impl Core {
    /// Forgets a taken-over stream once answered and the client is done sending.
    pub(super) fn remove_if_done(&mut self, id: u32) {
        if let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get(&id) {
            if t.replied && t.task.client_done {
                self.streams.remove(&id);
            }
        }
    }

    // ===== the proxy's own answers =====

    /// Ends a call in the relay's books; records it when the relay is the one to (a relayed
    /// call: the other kinds' tasks record theirs).
    pub(super) fn end_stream(&mut self, id: u32, status: Status) {
        if let Some(stream) = self.streams.remove(&id) {
            if let StreamKind::Relayed { .. } = stream.kind {
                self.ended.push((stream.method, status, stream.start.elapsed()));
            }
        }
    }

    pub(super) fn reset_at_backend(&mut self, id: u32) {
        if self.connected {
            frame::rst_stream(&mut self.to_backend, id, reason::CANCEL);
        }
    }

    /// Answers stream `id` with `status`, trailers-only.
    pub(super) fn answer_status(&mut self, id: u32, status: &Status) {
        frame::put_headers(&mut self.to_client, id, true, &trailers_only(status), self.client.max_frame);
    }

    /// Ends a relayed or intercepted call with `status` from the proxy: trailers after its
    /// head, else trailers-only; the runtime's stream is reset.
    pub(super) fn fail(&mut self, id: u32, status: Status) {
        let Some(stream) = self.streams.get_mut(&id) else { return };
        if stream.head_sent {
            let mut block = BytesMut::with_capacity(32 + status.message.len());
            put_fields(&mut block, &status.trailers());
            frame::put_headers(&mut self.to_client, id, true, &block, self.client.max_frame);
        } else {
            frame::put_headers(&mut self.to_client, id, true, &trailers_only(&status), self.client.max_frame);
        }
        if let StreamKind::Intercepted(i) = &mut stream.kind {
            i.answered(Err(status.clone()));
        }
        self.reset_at_backend(id);
        self.end_stream(id, status);
    }

    // ===== deadlines, loss, closing =====

    pub(super) fn arm(&mut self, deadline: Instant) {
        if self.next_deadline.is_some_and(|d| d <= deadline) && self.timer.is_some() {
            return;
        }
        self.next_deadline = Some(deadline);
        self.timer = Some(Box::pin(tokio::time::sleep_until(deadline.into())));
        self.aux_due = true;
    }

    pub(super) fn expire_deadlines(&mut self) {
        let now = Instant::now();
        self.next_deadline = None;
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, s) in &self.streams {
            let deadline = match &s.kind {
                StreamKind::Relayed { deadline } => *deadline,
                StreamKind::Intercepted(i) if i.sent => i.deadline,
                _ => None,
            };
            if let (Some(d), false) = (&deadline, s.head_sent) {
                if *d <= now {
                    expired.push((*id, d.saturating_duration_since(s.start)));
                } else {
                    next = Some(next.map_or(*d, |n| n.min(*d)));
                }
            }
        }
        for (id, timeout) in expired {
            let method = self.streams.get(&id).map(|s| s.method.clone()).unwrap_or_default();
            let status = Status::new(
                Code::DEADLINE_EXCEEDED,
                format!("{method}: deadline of {timeout:?} exceeded waiting for {}", self.runtime),
            );
            self.fail(id, status);
        }
        if let Some(d) = next {
            self.arm(d);
        }
    }
}
