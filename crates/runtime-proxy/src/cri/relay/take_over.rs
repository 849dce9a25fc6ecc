//! Intercepted and taken-over calls: the call's task, the commands it sends the relay, and the answers the relay writes
//! back.

use super::*;

/// Onward for an intercepted call: the body goes back to the relay, to be sent on `stream`;
/// the answer comes from it (which also enforces the deadline, as for relayed calls, so that
/// the task and the client learn the same outcome).
pub(super) fn on_stream<'a>(stream: u32, commands: mpsc::UnboundedSender<Command>) -> Onward<'a> {
    Box::new(move |_head, body, _deadline| {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let gone = || Status::new(Code::UNAVAILABLE, "the client's connection closed");
            commands.send(Command::Send { stream, body, answer: tx }).map_err(|_| gone())?;
            rx.await.unwrap_or_else(|_| Err(gone()))
        })
    })
}

/// The call of an intercepted or taken-over stream, its body read: the interceptor's, or one
/// unary call.
pub(super) async fn call<'a>(
    router: &'a Router,
    route: Route,
    method: &'a str,
    onward: Onward<'a>,
    parts: http::request::Parts,
    body: Bytes,
) -> Result<(Answer, Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>), Status> {
    match (route, router.interceptor()) {
        (Route::Intercept(spec), Some(interceptor)) => {
            let (answer, post) = interceptor.intercept(spec, method, onward, parts, body).await?;
            Ok((answer, post.map(|p| Box::pin(p) as Pin<Box<dyn Future<Output = ()> + Send + 'a>>)))
        }
        _ => {
            let deadline = grpc::parse_timeout(&parts.headers).map(|d| Instant::now() + d);
            Ok((onward(parts, body, deadline).await?, None))
        }
    }
}

/// Reads the body of an intercepted or taken-over call whole, under the interceptor's limits
/// (the defaults without one).
///
/// Errors: a request head that is not valid, and [`intercept::read_body`]'s.
async fn read_request(
    router: &Router,
    method: &str,
    parts: Option<http::request::Parts>,
    body: RequestBody,
) -> Result<(http::request::Parts, Bytes), Status> {
    let parts = parts.ok_or_else(|| Status::new(Code::INTERNAL, format!("{method}: not a valid request head")))?;
    let limits = router.interceptor().map(|i| i.hooks.limits.clone()).unwrap_or_default();
    let body = intercept::read_body(body, method, &limits).await?;
    Ok((parts, body))
}

/// The rest of an intercepted or taken-over call once its body is `read`: the call (unless the
/// client resets it first: `cancelled`), its answer or failure sent as a command to the
/// connection (`relayed`: the answer goes on on the client's stream `id`), its post stage, its
/// metrics. Owns all it needs, so that it can run on another thread
/// ([`crate::hooks::offload`]).
#[allow(clippy::too_many_arguments)]
async fn finish(
    router: Arc<Router>,
    route: Route,
    path: Box<str>,
    id: u32,
    commands: mpsc::UnboundedSender<Command>,
    relayed: bool,
    read: Result<(http::request::Parts, Bytes), Status>,
    cancelled: Pin<Box<dyn Future<Output = ()> + Send>>,
    start: Instant,
) {
    let method: &str = &path;
    let onward: Onward<'_> = if relayed {
        on_stream(id, commands.clone())
    } else {
        unary_call::over_shared(router.backend_for(method), method)
    };
    let outcome = tokio::select! {
        // A client's reset wins over what it caused (the answer channel dropped).
        biased;
        () = cancelled => {
            router.record(method, &Status::new(Code::CANCELLED, "client reset the call"), start.elapsed());
            return;
        }
        outcome = async {
            let (parts, body) = read?;
            call(&router, route, method, onward, parts, body).await
        } => outcome,
    };
    let (status, post) = match outcome {
        Ok((answer, post)) => {
            let status = answer.status();
            if !relayed {
                let _ = commands.send(Command::Reply { stream: id, answer: Ok(answer) });
            }
            (status, post)
        }
        Err(status) => {
            let command = if relayed {
                Command::Fail { stream: id, status: status.clone() }
            } else {
                Command::Reply { stream: id, answer: Err(status.clone()) }
            };
            let _ = commands.send(command);
            (status, None)
        }
    };
    if let Some(post) = post {
        post.await;
    }
    router.record(method, &status, start.elapsed());
}

impl Core {
    /// Starts the task of an intercepted call that goes on on this stream (`relayed`: `Some`
    /// of its deadline) or of a call taken over (sent over the shared connection).
    pub(super) fn take_over(
        &mut self,
        id: u32,
        path: Box<str>,
        route: Route,
        end_stream: bool,
        relayed: Option<Option<Instant>>,
    ) {
        let start = Instant::now();
        let parts = request_parts(&self.headers, &path, relayed.is_none());
        let (body_tx, body) = mpsc::unbounded_channel();
        let (cancel, cancelled) = oneshot::channel();
        let task = Task { body: (!end_stream).then_some(body_tx), cancel: Some(cancel), client_done: end_stream };
        let kind = if let Some(deadline) = relayed {
            StreamKind::Intercepted(Box::new(Intercepted {
                task,
                outgoing: None,
                window: self.backend.initial_window,
                answer: None,
                sent: false,
                upstream_closed: end_stream,
                head: None,
                data: BytesMut::new(),
                data_cut: false,
                deadline,
                early: BytesMut::new(),
                early_answer: None,
            }))
        } else {
            StreamKind::TakenOver(Box::new(TakenOver {
                task,
                window: self.client.initial_window,
                reply: None,
                replied: false,
            }))
        };
        self.streams.insert(id, Stream { method: path.clone(), start, head_sent: false, kind });
        let (router, commands) = (self.router.clone(), self.commands_tx.clone());
        let relayed = relayed.is_some();
        self.aux_due = true;
        self.tasks.spawn(Box::pin(async move {
            let cancelled = async {
                if cancelled.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let mut cancelled = Box::pin(cancelled);
            // The body first: its size says where the rest of the call runs
            // (`crate::hooks::offload`).
            let read = tokio::select! {
                biased;
                () = &mut cancelled => {
                    router.record(&path, &Status::new(Code::CANCELLED, "client reset the call"), start.elapsed());
                    return;
                }
                read = read_request(&router, &path, parts, body) => read,
            };
            let size = read.as_ref().map_or(0, |(_, body)| body.len());
            // Only intercepted calls have a hook flow to move; a taken-over call is a relay.
            let offload =
                matches!(route, Route::Intercept(_)).then(|| router.interceptor().map(|i| i.hooks.clone())).flatten();
            let rest = finish(router, route, path, id, commands, relayed, read, cancelled, start);
            match offload {
                Some(hooks) => hooks.offload.run(size, rest).await,
                None => rest.await,
            }
        }));
    }

    // ===== runtime → client =====

    pub(super) fn on_command(&mut self, command: Command) {
        match command {
            Command::Send { stream, body, answer } => {
                match (self.connected, self.streams.get_mut(&stream)) {
                    (true, Some(Stream { kind: StreamKind::Intercepted(i), head_sent, .. })) => {
                        i.sent = true;
                        if !i.early.is_empty() {
                            self.to_client.extend_from_slice(&i.early);
                            i.early.clear();
                            *head_sent = true;
                        }
                        if let Some(early) = i.early_answer.take() {
                            // Answered already: the body has nowhere to go.
                            let _ = answer.send(early);
                            self.reset_at_backend(stream);
                            self.streams.remove(&stream);
                            return;
                        }
                        i.outgoing = Some(body);
                        i.answer = Some(answer);
                    }
                    _ => {
                        let why = self.gone.clone().unwrap_or_else(|| "the client's connection closed".into());
                        let _ = answer.send(Err(Status::new(Code::UNAVAILABLE, why)));
                        return;
                    }
                }
                self.flush_send(stream);
            }
            Command::Fail { stream, status } => {
                if let Some(Stream { kind: StreamKind::Intercepted(_), .. }) = self.streams.get(&stream) {
                    self.fail(stream, status);
                }
            }
            Command::Reply { stream, answer } => self.on_reply(stream, answer),
            Command::Probed { up } => {
                self.probing = false;
                if up && self.closing == Closing::Open {
                    tracing::info!(backend = %self.runtime.path().display(), "backend reachable again; asking the client to reconnect");
                    self.begin_close();
                }
            }
        }
    }

    /// Sends as much of an intercepted call's body as the runtime's windows take.
    pub(super) fn flush_send(&mut self, id: u32) {
        let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&id) else { return };
        if i.upstream_closed {
            i.outgoing = None;
            return;
        }
        let Some(out) = &mut i.outgoing else { return };
        let room = self.backend.window.room.min(i.window).max(0) as usize;
        let n = room.min(out.len());
        if n == 0 && !out.is_empty() {
            return;
        }
        let chunk = out.split_to(n);
        let end = out.is_empty();
        frame::put_data(&mut self.to_backend, id, &chunk, end, self.backend.max_frame);
        self.backend.window.room -= n as i64;
        self.backend.window.debt += n as u64;
        i.window -= n as i64;
        if end {
            i.outgoing = None;
        }
    }

    /// Writes what waits for window room: intercepted calls' bodies to the runtime, taken-over
    /// calls' answers to the client.
    pub(super) fn flush_pending(&mut self) {
        let waiting: Vec<(u32, bool)> = self
            .streams
            .iter()
            .filter_map(|(id, s)| match &s.kind {
                StreamKind::Intercepted(i) if i.outgoing.is_some() => Some((*id, true)),
                StreamKind::TakenOver(t) if t.reply.is_some() => Some((*id, false)),
                _ => None,
            })
            .collect();
        for (id, body) in waiting {
            if body {
                self.flush_send(id);
            } else {
                self.flush_reply(id);
            }
        }
    }

    pub(super) fn on_reply(&mut self, id: u32, answer: Result<Answer, Status>) {
        let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&id) else { return };
        t.reply = Some(match answer {
            Ok(answer) => {
                let mut head = BytesMut::with_capacity(128);
                frame::put_status(&mut head, answer.head.status().as_u16());
                put_fields(&mut head, answer.head.headers());
                let trailers = answer.trailers.as_ref().map(|t| {
                    let mut b = BytesMut::with_capacity(64);
                    put_fields(&mut b, t);
                    b
                });
                PendingReply { head: Some(head), data: answer.data, trailers }
            }
            Err(status) => PendingReply { head: Some(trailers_only(&status)), data: Bytes::new(), trailers: None },
        });
        self.flush_reply(id);
    }

    /// Writes as much of a taken-over call's answer as the client's windows take (none of its
    /// DATA while the client's SETTINGS wait for their ACK: `Core::client_settings_unacked`).
    pub(super) fn flush_reply(&mut self, id: u32) {
        let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&id) else { return };
        let Some(reply) = &mut t.reply else { return };
        if let Some(head) = reply.head.take() {
            let end = reply.data.is_empty() && reply.trailers.is_none();
            frame::put_headers(&mut self.to_client, id, end, &head, self.client.max_frame);
        }
        if !reply.data.is_empty() {
            let room = if self.client_settings_unacked > 0 {
                0
            } else {
                self.client.window.room.min(t.window).max(0) as usize
            };
            let n = room.min(reply.data.len());
            if n > 0 {
                let chunk = reply.data.split_to(n);
                let end = reply.data.is_empty() && reply.trailers.is_none();
                frame::put_data(&mut self.to_client, id, &chunk, end, self.client.max_frame);
                self.client.window.room -= n as i64;
                self.client.window.debt += n as u64;
                t.window -= n as i64;
            }
        }
        if reply.data.is_empty() {
            if let Some(trailers) = reply.trailers.take() {
                frame::put_headers(&mut self.to_client, id, true, &trailers, self.client.max_frame);
            }
            t.reply = None;
            t.replied = true;
            if !t.task.client_done {
                // Answered while the client still sends (a task that failed early): it is told
                // to stop (RFC 9113 §8.1), and the stream is forgotten.
                t.task.cancel();
                frame::rst_stream(&mut self.to_client, id, reason::NO_ERROR);
                self.streams.remove(&id);
            }
            self.remove_if_done(id);
        }
    }
}
