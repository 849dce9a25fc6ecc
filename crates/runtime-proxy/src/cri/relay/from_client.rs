//! The client's side of a relayed connection: its bytes, frames, DATA and header blocks.

use super::*;

impl Core {
    pub(super) fn client_bytes(&mut self) -> Result<(), Fatal> {
        if !self.preface {
            if self.client.input.len() < frame::PREFACE.len() {
                return if frame::PREFACE.starts_with(&self.client.input) {
                    Ok(())
                } else {
                    Err(Fatal(reason::PROTOCOL_ERROR, "not an HTTP/2 client"))
                };
            }
            if &self.client.input[..frame::PREFACE.len()] != frame::PREFACE {
                return Err(Fatal(reason::PROTOCOL_ERROR, "not an HTTP/2 client"));
            }
            self.client.input.advance(frame::PREFACE.len());
            self.preface = true;
            if self.connected {
                self.to_backend.extend_from_slice(frame::PREFACE);
            } else {
                frame::settings(&mut self.to_client, &[(setting::MAX_CONCURRENT_STREAMS, self.max_streams)]);
            }
        }
        self.frames(Side::Client)
    }

    pub(super) fn client_frame(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        if matches!(head.kind, kind::HEADERS | kind::CONTINUATION) || self.client.block.is_some() {
            return match assemble(&mut self.client.block, head, raw)? {
                Some(block) => self.client_block(block.stream, block.flags, &block.raw, &block.fragment),
                None => Ok(()),
            };
        }
        match head.kind {
            kind::DATA => self.client_data(head, raw),
            kind::SETTINGS => {
                if !head.has(flag::ACK) {
                    for (id, value) in frame::settings_entries(&raw[HEAD_LEN..]) {
                        match id {
                            setting::HEADER_TABLE_SIZE => self.backend.hpack.set_allowed(value as usize),
                            setting::INITIAL_WINDOW_SIZE => {
                                let delta = i64::from(value) - self.client.initial_window;
                                self.client.initial_window = i64::from(value);
                                for s in self.streams.values_mut() {
                                    if let StreamKind::TakenOver(t) = &mut s.kind {
                                        t.window += delta;
                                    }
                                }
                            }
                            setting::MAX_FRAME_SIZE => self.client.max_frame = frame_size(value),
                            _ => {}
                        }
                    }
                    if !self.connected {
                        frame::settings_ack(&mut self.to_client);
                        return Ok(());
                    }
                    self.client_settings_unacked += 1;
                } else if !self.connected {
                    return Ok(());
                }
                self.send_backend(raw);
                self.flush_pending();
                Ok(())
            }
            kind::PING => {
                if head.has(flag::ACK) && raw[HEAD_LEN..] == CLOSING_PING {
                    if self.closing == Closing::Pinged {
                        frame::goaway(&mut self.to_client, self.last_stream, reason::NO_ERROR);
                        self.closing = Closing::Final(self.last_stream);
                    }
                } else if self.connected {
                    self.send_backend(raw);
                } else if !head.has(flag::ACK) && head.len == 8 {
                    let opaque: [u8; 8] = raw[HEAD_LEN..].try_into().expect("8 bytes");
                    frame::ping(&mut self.to_client, true, &opaque);
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                let increment = increment(&head, raw)?;
                if head.stream == 0 {
                    let theirs = self.client.window.granted(increment);
                    if theirs > 0 && self.connected {
                        frame::window_update(&mut self.to_backend, 0, theirs);
                    }
                    self.release_backend_held();
                    self.flush_pending();
                } else if let Some(Stream { kind: StreamKind::TakenOver(t), .. }) = self.streams.get_mut(&head.stream) {
                    t.window += i64::from(increment);
                    self.flush_reply(head.stream);
                } else {
                    self.send_backend(raw);
                }
                Ok(())
            }
            kind::RST_STREAM => {
                let Some(stream) = self.streams.get_mut(&head.stream) else {
                    self.send_backend(raw);
                    return Ok(());
                };
                match &mut stream.kind {
                    StreamKind::Relayed { .. } => {
                        self.send_backend(raw);
                        self.end_stream(head.stream, Status::new(Code::CANCELLED, "client reset the call"));
                    }
                    // The task is told, and records the call itself.
                    StreamKind::Intercepted(i) => {
                        i.task.cancel();
                        self.send_backend(raw);
                        self.streams.remove(&head.stream);
                    }
                    StreamKind::TakenOver(t) => {
                        t.task.cancel();
                        self.streams.remove(&head.stream);
                    }
                }
                Ok(())
            }
            // PRIORITY, GOAWAY, PUSH_PROMISE (a client must not send it: the runtime says so),
            // and frame types this relay does not know (which peers ignore).
            _ => {
                self.send_backend(raw);
                Ok(())
            }
        }
    }

    pub(super) fn client_data(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        let task = match self.streams.get_mut(&head.stream).map(|s| &mut s.kind) {
            Some(StreamKind::Intercepted(i)) => &mut i.task,
            Some(StreamKind::TakenOver(t)) => &mut t.task,
            _ => {
                if !self.connected {
                    if head.len > 0 {
                        frame::window_update(&mut self.to_client, 0, head.len as u32);
                    }
                } else if head.len as i64 > self.backend.window.room {
                    self.client.held = Some((head, BytesMut::from(raw)));
                    self.client.scanned = 0;
                } else {
                    self.backend.window.room -= head.len as i64;
                    self.send_backend(raw);
                }
                return Ok(());
            }
        };
        let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
        // The runtime does not get these bytes as they are: the client gets its connection
        // window back (with the next bytes it is written, or once CREDIT_BATCH is owed), and
        // the stream's at once while the task takes the body (a body it no longer takes stalls
        // in the client, not in the proxy).
        if head.len > 0 {
            self.client_credit += head.len as u32;
            if !head.has(flag::END_STREAM) && task.body.is_some() {
                frame::window_update(&mut self.to_client, head.stream, head.len as u32);
            }
        }
        if let Some(body) = &task.body {
            if range.end > range.start {
                let chunk = Bytes::copy_from_slice(&raw[HEAD_LEN + range.start..HEAD_LEN + range.end]);
                if body.send(Ok(chunk)).is_err() {
                    task.body = None;
                }
            }
        }
        if head.has(flag::END_STREAM) {
            task.body = None;
            task.client_done = true;
            self.remove_if_done(head.stream);
        }
        if self.client_credit >= CREDIT_BATCH {
            self.settle_credit();
        }
        Ok(())
    }

    /// Sends the held client DATA frame once the runtime's window has room, and reads on.
    pub(super) fn release_client_held(&mut self) {
        if let Some((head, _)) = &self.client.held {
            if head.len as i64 <= self.backend.window.room {
                let (head, raw) = self.client.held.take().expect("checked");
                self.backend.window.room -= head.len as i64;
                self.send_backend(raw.as_ref());
                if let Err(Fatal(code, why)) = self.client_bytes() {
                    self.fatal(code, why);
                }
            }
        }
    }

    /// A whole header block from the client: decoded, forwarded, and a new call routed.
    /// `raw`: the block's frames as they came; `fragment`: the block itself.
    pub(super) fn client_block(&mut self, id: u32, flags: u8, raw: &[u8], fragment: &[u8]) -> Result<(), Fatal> {
        decode(&mut self.client.hpack, fragment, &mut self.headers)?;
        let end_stream = flags & flag::END_STREAM != 0;
        if id <= self.last_stream || id.is_multiple_of(2) {
            // Trailers of a call the client streams to (or a peer error the runtime reports).
            self.send_backend(raw);
            if end_stream {
                let task = match self.streams.get_mut(&id).map(|s| &mut s.kind) {
                    Some(StreamKind::Intercepted(i)) => {
                        i.upstream_closed = true;
                        Some(&mut i.task)
                    }
                    Some(StreamKind::TakenOver(t)) => Some(&mut t.task),
                    _ => None,
                };
                if let Some(task) = task {
                    task.body = None;
                    task.client_done = true;
                }
                self.remove_if_done(id);
            }
            return Ok(());
        }
        self.last_stream = id;
        // A request without a `:path` (or with one that is not UTF-8) is relayed under an empty
        // method name (metrics label `other`); the runtime answers it as it sees fit.
        let path = Box::<str>::from(String::from_utf8_lossy(self.headers.get(b":path").unwrap_or_default()));
        if let Closing::Final(last) = self.closing {
            if id > last {
                // Refused by the final GOAWAY: the client knows; the runtime must not run it.
                self.send_backend(raw);
                self.reset_at_backend(id);
                return Ok(());
            }
        }
        let start = Instant::now();
        if let Some(gone) = self.gone.clone() {
            // No runtime connection to relay on: the call goes over the shared one, which
            // answers UNAVAILABLE naming the socket while the runtime is down. Once it is back,
            // the client is asked to come back on a new, relayed, connection.
            if self.closing == Closing::Open && !self.probing {
                // Is it back? Dialled by a task (a connect can block), answered as a command.
                self.probing = true;
                self.aux_due = true;
                let (runtime, commands) = (self.runtime.clone(), self.commands_tx.clone());
                self.tasks.spawn(async move {
                    let up = runtime.dial_raw().await.is_ok();
                    let _ = commands.send(Command::Probed { up });
                });
            }
            if self.streams.len() >= self.max_streams as usize {
                frame::rst_stream(&mut self.to_client, id, reason::REFUSED_STREAM);
                return Ok(());
            }
            if crate::cri::newer_cri::is_server_stream(&path) {
                // A stream cannot be taken over whole; the client opens it again on the new
                // connection.
                let status = Status::new(Code::UNAVAILABLE, format!("{path}: {gone}"));
                self.answer_status(id, &status);
                self.router.record(&path, &status, start.elapsed());
                return Ok(());
            }
            let route = self.router.route(&path);
            self.take_over(id, path, route, end_stream, None);
            return Ok(());
        }
        let only_held = self.to_backend.len() == self.held_heads;
        self.send_backend(raw);
        if self.streams.len() >= self.max_streams as usize {
            self.reset_at_backend(id);
            frame::rst_stream(&mut self.to_client, id, reason::REFUSED_STREAM);
            return Ok(());
        }
        let route = self.router.route(&path);
        let deadline = match route {
            Route::Unary => None,
            _ => self.headers.get(b"grpc-timeout").and_then(grpc::parse_timeout_value).map(|d| start + d),
        };
        if let Some(d) = deadline {
            self.arm(d);
        }
        match route {
            Route::Relay => {
                self.streams.insert(
                    id,
                    Stream { method: path, start, head_sent: false, kind: StreamKind::Relayed { deadline } },
                );
            }
            Route::Intercept(_) => {
                // A call with a body: its head waits for it (unless other bytes go anyway).
                if only_held && !end_stream && self.connected {
                    self.held_heads = self.to_backend.len();
                }
                self.take_over(id, path, route, end_stream, Some(deadline));
            }
            Route::Unary => {
                self.reset_at_backend(id);
                self.take_over(id, path, route, end_stream, None);
            }
        }
        Ok(())
    }
}
