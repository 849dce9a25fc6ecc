//! The runtime's side of a relayed connection: its bytes, frames, DATA and header blocks.

use super::*;

impl Core {
    pub(super) fn backend_bytes(&mut self) -> Result<(), Fatal> {
        self.frames(Side::Backend)
    }

    pub(super) fn backend_frame(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        if matches!(head.kind, kind::HEADERS | kind::CONTINUATION) || self.backend.block.is_some() {
            return match assemble(&mut self.backend.block, head, raw)? {
                Some(block) => self.backend_block(block.stream, block.flags, &block.raw, &block.fragment),
                None => Ok(()),
            };
        }
        let on_stream = match self.streams.get_mut(&head.stream) {
            Some(Stream { kind: StreamKind::Relayed { .. }, .. }) => true,
            Some(Stream { kind: StreamKind::Intercepted(i), .. }) if i.sent => true,
            Some(Stream { kind: StreamKind::Intercepted(i), .. }) => {
                // Before the pre stage is done: a reset is held with the rest (see
                // `backend_block`); a message before the request's is not gRPC, and dropped.
                if head.kind == kind::RST_STREAM && i.early_answer.is_none() {
                    i.early.extend_from_slice(raw);
                    i.early_answer = Some(Err(Status::new(Code::UNAVAILABLE, "stream reset by the backend")));
                    return Ok(());
                }
                false
            }
            _ => false,
        };
        match head.kind {
            kind::DATA => {
                if !on_stream {
                    // A stream the relay ended or took over: the runtime gets its window back.
                    if head.len > 0 {
                        frame::window_update(&mut self.to_backend, 0, head.len as u32);
                    }
                    return Ok(());
                }
                if head.len as i64 > self.client.window.room {
                    self.backend.held = Some((head, BytesMut::from(raw)));
                    self.backend.scanned = 0;
                    return Ok(());
                }
                self.forward_data(head, raw)
            }
            kind::SETTINGS if !head.has(flag::ACK) => {
                let mut entries: Vec<(u16, u32)> = frame::settings_entries(&raw[HEAD_LEN..]).collect();
                let mut capped = false;
                for (id, value) in &mut entries {
                    match *id {
                        setting::HEADER_TABLE_SIZE => self.client.hpack.set_allowed(*value as usize),
                        setting::MAX_FRAME_SIZE => self.backend.max_frame = frame_size(*value),
                        setting::INITIAL_WINDOW_SIZE => {
                            let delta = i64::from(*value) - self.backend.initial_window;
                            self.backend.initial_window = i64::from(*value);
                            for s in self.streams.values_mut() {
                                if let StreamKind::Intercepted(i) = &mut s.kind {
                                    i.window += delta;
                                }
                            }
                        }
                        setting::MAX_CONCURRENT_STREAMS => {
                            *value = (*value).min(self.max_streams);
                            capped = true;
                        }
                        _ => {}
                    }
                }
                if !capped {
                    entries.push((setting::MAX_CONCURRENT_STREAMS, self.max_streams));
                }
                frame::settings(&mut self.to_client, &entries);
                self.backend_settings = true;
                self.flush_pending();
                Ok(())
            }
            kind::SETTINGS => {
                // The ACK of the client's SETTINGS: once the client has it, the relay's own DATA
                // may go to it under them.
                self.to_client.extend_from_slice(raw);
                self.client_settings_unacked = self.client_settings_unacked.saturating_sub(1);
                if self.client_settings_unacked == 0 {
                    self.flush_pending();
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                let increment = increment(&head, raw)?;
                if head.stream == 0 {
                    let theirs = self.backend.window.granted(increment);
                    if theirs > 0 {
                        frame::window_update(&mut self.to_client, 0, theirs);
                    }
                    self.release_client_held();
                    self.flush_pending();
                } else if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&head.stream)
                {
                    i.window += i64::from(increment);
                    self.flush_send(head.stream);
                } else if on_stream {
                    self.to_client.extend_from_slice(raw);
                }
                Ok(())
            }
            kind::PUSH_PROMISE => Err(Fatal(reason::PROTOCOL_ERROR, "PUSH_PROMISE from a gRPC server")),
            // A stream the relay answers itself (taken over, or an early answer held): not the
            // client's business. A reset of a stream already ended (RST_STREAM(NO_ERROR) after
            // the trailers: "stop sending") goes on.
            kind::RST_STREAM | kind::PRIORITY if head.stream != 0 && !on_stream => {
                if head.kind == kind::RST_STREAM && !self.streams.contains_key(&head.stream) {
                    self.to_client.extend_from_slice(raw);
                }
                Ok(())
            }
            kind::GOAWAY if head.len >= 8 => {
                // The runtime is going away: streams above `last` were not processed (the
                // client retries them, it has the GOAWAY); the connection ends once the rest
                // have, and the relay adds no GOAWAY of its own.
                self.to_client.extend_from_slice(raw);
                let last = u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]]) & 0x7fff_ffff;
                let refused: Vec<u32> = self
                    .streams
                    .range(last.saturating_add(1)..)
                    .filter(|(_, s)| !matches!(s.kind, StreamKind::TakenOver(_)))
                    .map(|(id, _)| *id)
                    .collect();
                for id in refused {
                    if let Some(Stream { kind: StreamKind::Intercepted(mut i), .. }) = self.streams.remove(&id) {
                        i.task.cancel();
                    }
                }
                self.closing = match self.closing {
                    Closing::Final(f) => Closing::Final(f.min(last)),
                    _ => Closing::Final(last),
                };
                Ok(())
            }
            kind::RST_STREAM => {
                self.to_client.extend_from_slice(raw);
                let code = if head.len == 4 {
                    u32::from_be_bytes([raw[9], raw[10], raw[11], raw[12]])
                } else {
                    reason::PROTOCOL_ERROR
                };
                let status =
                    Status::new(Code::UNAVAILABLE, format!("stream reset by the backend: {}", h2::Reason::from(code)));
                if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&head.stream) {
                    i.answered(Err(status.clone()));
                }
                self.end_stream(head.stream, status);
                Ok(())
            }
            // SETTINGS ACK, PING, GOAWAY, PRIORITY, unknown types.
            _ => {
                self.to_client.extend_from_slice(raw);
                Ok(())
            }
        }
    }

    pub(super) fn forward_data(&mut self, head: Head, raw: &[u8]) -> Result<(), Fatal> {
        self.client.window.room -= head.len as i64;
        self.to_client.extend_from_slice(raw);
        if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&head.stream) {
            let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
            if i.data.len() + range.len() <= ANSWER_COPY_LIMIT && !i.data_cut {
                i.data.extend_from_slice(&raw[HEAD_LEN + range.start..HEAD_LEN + range.end]);
            } else {
                // Too long to copy: the interceptor gets no message from it (the client still
                // gets all of it).
                i.data_cut = true;
                i.data.clear();
            }
            if head.has(flag::END_STREAM) {
                // Ended without trailers: the answer's status is the head's, if any.
                let answer = Answer {
                    head: i.head.take().unwrap_or_default(),
                    data: std::mem::take(&mut i.data).freeze(),
                    trailers: None,
                };
                i.answered(Ok(answer));
            }
        }
        if head.has(flag::END_STREAM) {
            self.end_stream(head.stream, Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status"));
        }
        Ok(())
    }

    /// Sends the held runtime DATA frame once the client's window has room, and reads on.
    pub(super) fn release_backend_held(&mut self) {
        if let Some((head, _)) = &self.backend.held {
            if head.len as i64 <= self.client.window.room {
                let (head, raw) = self.backend.held.take().expect("checked");
                let live = match self.streams.get(&head.stream) {
                    Some(Stream { kind: StreamKind::Relayed { .. }, .. }) => true,
                    Some(Stream { kind: StreamKind::Intercepted(i), .. }) => i.sent,
                    _ => false,
                };
                let result = if live {
                    self.forward_data(head, &raw)
                } else {
                    // The call ended meanwhile (a deadline, a failure): the runtime gets its
                    // window back, the client nothing on a closed stream.
                    if head.len > 0 {
                        frame::window_update(&mut self.to_backend, 0, head.len as u32);
                    }
                    Ok(())
                };
                let result = result.and_then(|()| self.backend_bytes());
                if let Err(Fatal(_, why)) = result {
                    self.backend_lost(format!("protocol error: {why}"));
                }
            }
        }
    }

    /// A whole header block from the runtime: the response head or trailers of a call.
    /// `raw`: the block's frames as they came; `fragment`: the block itself.
    pub(super) fn backend_block(&mut self, id: u32, flags: u8, raw: &[u8], fragment: &[u8]) -> Result<(), Fatal> {
        let end_stream = flags & flag::END_STREAM != 0;
        if self.b_verbatim {
            if let Some(stream @ Stream { kind: StreamKind::Relayed { .. }, .. }) = self.streams.get_mut(&id) {
                // A relayed call's block goes on as it came, before it is decoded (for the
                // call's status, and to follow the table): that waits until the write is done.
                stream.head_sent = true;
                self.to_client.extend_from_slice(raw);
                let ended =
                    if end_stream { self.streams.remove(&id).map(|s| (s.method, s.start.elapsed())) } else { None };
                let at = self.undecoded_bytes.len();
                self.undecoded_bytes.extend_from_slice(fragment);
                self.undecoded.push((at..self.undecoded_bytes.len(), ended));
                return Ok(());
            }
        }
        self.decode_undecoded()?;
        decode(&mut self.backend.hpack, fragment, &mut self.headers)?;
        let Some(stream) = self.streams.get_mut(&id) else {
            // Not forwardable: from now on the client's table is left as it is.
            self.b_verbatim = false;
            return Ok(());
        };
        if let StreamKind::TakenOver(_) = stream.kind {
            self.b_verbatim = false;
            return Ok(());
        }
        if let StreamKind::Intercepted(i) = &mut stream.kind {
            if !i.sent {
                // The runtime answers before the pre stage is done: held, so that the client
                // gets it after the hooks ran, as it would without the relay.
                self.b_verbatim = false;
                let first = i.head.is_none();
                if first {
                    i.head = Some(response_head(&self.headers));
                }
                frame::put_headers(&mut i.early, id, end_stream, &literal_block(&self.headers), self.client.max_frame);
                if end_stream {
                    let head = i.head.take().unwrap_or_default();
                    let trailers = (!first).then(|| fields(&self.headers));
                    i.early_answer = Some(Ok(Answer { head, data: Bytes::new(), trailers }));
                }
                return Ok(());
            }
        }
        let first = !stream.head_sent;
        stream.head_sent = true;
        if let StreamKind::Intercepted(i) = &mut stream.kind {
            if first {
                i.head = Some(response_head(&self.headers));
            }
        }
        if self.b_verbatim {
            self.to_client.extend_from_slice(raw);
        } else {
            frame::put_headers(
                &mut self.to_client,
                id,
                end_stream,
                &literal_block(&self.headers),
                self.client.max_frame,
            );
        }
        if end_stream {
            let status = status_of(&self.headers);
            if let Some(Stream { kind: StreamKind::Intercepted(i), .. }) = self.streams.get_mut(&id) {
                if !first {
                    let trailers = fields(&self.headers);
                    let answer = Answer {
                        head: i.head.take().unwrap_or_default(),
                        data: std::mem::take(&mut i.data).freeze(),
                        trailers: Some(trailers),
                    };
                    i.answered(Ok(answer));
                } else {
                    let answer = Answer { head: i.head.take().unwrap_or_default(), data: Bytes::new(), trailers: None };
                    i.answered(Ok(answer));
                }
            }
            self.end_stream(id, status);
        }
        Ok(())
    }

    // ===== the intercepted call's body, the taken-over call's answer =====
}
