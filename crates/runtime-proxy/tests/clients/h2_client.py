"""The client-matrix scenario (cri_scenario.py) as raw HTTP/2 requests WITHOUT an :authority.

No gRPC library: the Python `h2` package over a plain unix socket, each call a POST with only
:method, :scheme and :path as pseudo-headers (h2 needs validate_outbound_headers=False to send a
request without :authority or Host), the gRPC length-prefixed framing by hand, the messages the
protobuf classes generated for grpcio_client.py, and the status read from grpc-status and
grpc-message in the trailers (or in the headers of a trailers-only answer).

Run with PYTHONPATH=<setup dir>/gen, by <setup dir>/venv/bin/python (tests/clients/setup.sh).
"""

import socket
import struct
import threading
import urllib.parse

import h2.config
import h2.connection
import h2.errors
import h2.events

import cri_scenario
from cri_scenario import DEADLINE, CallError, code_name


def frame(message):
    """A gRPC message frame: not compressed, 4-byte big-endian length, the serialized message."""
    body = message.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


def unframe(buffer):
    """Splits the complete gRPC frames off `buffer`: (messages, rest). Compressed frames are refused."""
    messages = []
    while len(buffer) >= 5:
        flag, length = struct.unpack(">BI", buffer[:5])
        if len(buffer) < 5 + length:
            break
        if flag != 0:
            raise CallError("INTERNAL", f"compressed message (flag {flag}) though none was asked for")
        messages.append(bytes(buffer[5:5 + length]))
        buffer = buffer[5 + length:]
    return messages, buffer


def status_of(headers, trailers):
    """The CallError of a finished call, or None when grpc-status is 0."""
    fields = dict(trailers or headers or [])
    if "grpc-status" not in fields:
        http = dict(headers or []).get(":status", "none")
        raise CallError("UNKNOWN", f"no grpc-status (HTTP status {http}, trailers {trailers!r})")
    code = int(fields["grpc-status"])
    if code == 0:
        return None
    return CallError(code_name(code), urllib.parse.unquote(fields.get("grpc-message", "")))


class Connection:
    """One HTTP/2 connection on the unix socket, driven by whoever calls `pump`."""

    def __init__(self, path, timeout):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8", validate_outbound_headers=False)
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.initiate_connection()
        self.flush()

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(self, path, message, deadline):
        """Sends a whole request (headers, one message, end of stream); returns its stream ID."""
        stream = self.h2.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
                   ("content-type", "application/grpc"), ("te", "trailers")]
        if deadline:
            headers.append(("grpc-timeout", f"{deadline}S"))
        self.h2.send_headers(stream, headers)
        self.h2.send_data(stream, frame(message), end_stream=True)
        self.flush()
        return stream

    def pump(self):
        """Reads once from the socket; returns the h2 events (their data acknowledged)."""
        data = self.sock.recv(65536)
        if not data:
            raise CallError("UNAVAILABLE", "connection closed by the server")
        events = self.h2.receive_data(data)
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        self.flush()
        return events

    def close(self):
        try:
            self.h2.close_connection()
            self.flush()
        except OSError:
            pass
        self.sock.close()


class Stream:
    """What arrived on one stream so far."""

    def __init__(self, stream_id):
        self.id = stream_id
        self.headers = None
        self.trailers = None
        self.buffer = b""
        self.ended = False

    def take(self, event):
        """Books `event` if it is this stream's; raises CallError on a reset or GOAWAY."""
        if isinstance(event, h2.events.ConnectionTerminated):
            raise CallError("UNAVAILABLE", f"GOAWAY {event.error_code!r} {event.additional_data!r}")
        if getattr(event, "stream_id", None) != self.id:
            return
        if isinstance(event, h2.events.StreamReset):
            raise CallError("INTERNAL", f"stream reset by the server: RST_STREAM {event.error_code!r}")
        if isinstance(event, h2.events.ResponseReceived):
            self.headers = event.headers
        elif isinstance(event, h2.events.TrailersReceived):
            self.trailers = event.headers
        elif isinstance(event, h2.events.DataReceived):
            self.buffer += event.data
        elif isinstance(event, h2.events.StreamEnded):
            self.ended = True


class H2Watch(cri_scenario.Watch):
    """A server-streaming call on a connection of its own, read by a thread; cancelled with
    RST_STREAM(CANCEL) by that thread, which looks at the cancel flag every 0.1 s."""

    def __init__(self, socket_path, path, request, response_class):
        super().__init__()
        self._conn = Connection(socket_path, 0.1)
        self._stream = Stream(self._conn.start(path, request, None))
        self._response_class = response_class
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            while not self._stream.ended:
                if self._cancel.is_set():
                    self._conn.h2.reset_stream(self._stream.id, h2.errors.ErrorCodes.CANCEL)
                    self._conn.flush()
                    return
                try:
                    events = self._conn.pump()
                except socket.timeout:
                    continue
                for event in events:
                    self._stream.take(event)
                messages, self._stream.buffer = unframe(self._stream.buffer)
                for m in messages:
                    self._add(self._response_class.FromString(m))
            error = status_of(self._stream.headers, self._stream.trailers)
            self._fail(error or CallError("OK", "the event stream ended"))
        except CallError as e:
            self._fail(e)
        except OSError as e:
            self._fail(CallError("UNAVAILABLE", f"connection: {e}"))
        finally:
            self._conn.close()

    def cancel(self):
        self._cancel.set()
        self._thread.join(5)


class H2Transport:
    """Unary calls one after another on one connection; each watch on a connection of its own."""

    def __init__(self, args):
        self._socket = args.socket
        self._service = f"/runtime.{args.api}.RuntimeService/"
        self._conn = Connection(args.socket, DEADLINE)

    def unary(self, method, request, response_class):
        try:
            stream = Stream(self._conn.start(self._service + method, request, DEADLINE))
            while not stream.ended:
                for event in self._conn.pump():
                    stream.take(event)
        except socket.timeout:
            raise CallError("DEADLINE_EXCEEDED", f"no answer within {DEADLINE} s") from None
        except OSError as e:
            raise CallError("UNAVAILABLE", f"connection: {e}") from None
        error = status_of(stream.headers, stream.trailers)
        if error:
            raise error
        messages, rest = unframe(stream.buffer)
        if len(messages) != 1 or rest:
            raise CallError("INTERNAL", f"{len(messages)} messages and {len(rest)} stray bytes in a unary answer")
        return response_class.FromString(messages[0])

    def watch(self, method, request, response_class):
        return H2Watch(self._socket, self._service + method, request, response_class)

    def close(self):
        self._conn.close()


if __name__ == "__main__":
    cri_scenario.main("h2-no-authority", H2Transport)
