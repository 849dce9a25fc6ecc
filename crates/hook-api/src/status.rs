//! The one status type of the project: a gRPC status code and message, as runtime-proxy relays
//! and answers it, as a hook server's failure is reported, and as runtime-hooks answers the
//! proxy (through tonic) or the runtime (through NRI's ttrpc, whose `Status` carries the same
//! `google.rpc.Code` numbers).
//!
//! # Shape
//!
//! [`Code`] is the number of `google.rpc.Code` (`grpc-status` on the HTTP/2 wire, `code` of
//! ttrpc's `Status`); [`Status`] is a code with a human-readable message.
//!
//! # Conversions
//!
//! * to and from [`tonic::Status`] (`From` both ways), for the tonic servers and clients;
//! * on the HTTP/2 wire (`grpc-status`, percent-encoded `grpc-message`): runtime-proxy's
//!   `grpc` module, which reads and writes header blocks itself.

use std::fmt;

/// A gRPC status code (`google.rpc.Code`), as carried in the `grpc-status` header or trailer
/// and in ttrpc's `Status.code`. Codes outside 0..=16 are kept as they came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Code(pub u16);

impl Code {
    /// `OK` (0): the call succeeded.
    pub const OK: Code = Code(0);
    /// `CANCELLED` (1): the call was cancelled, usually by the caller.
    pub const CANCELLED: Code = Code(1);
    /// `UNKNOWN` (2): an error with no better code (e.g. a status from another error space).
    pub const UNKNOWN: Code = Code(2);
    /// `INVALID_ARGUMENT` (3): the request is invalid whatever the system's state.
    pub const INVALID_ARGUMENT: Code = Code(3);
    /// `DEADLINE_EXCEEDED` (4): the deadline expired before the call completed.
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    /// `NOT_FOUND` (5): an object the call names does not exist.
    pub const NOT_FOUND: Code = Code(5);
    /// `PERMISSION_DENIED` (7): the caller may not do this.
    pub const PERMISSION_DENIED: Code = Code(7);
    /// `RESOURCE_EXHAUSTED` (8): a resource ran out, e.g. a message over the size limit.
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    /// `FAILED_PRECONDITION` (9): the system is not in the state the call needs.
    pub const FAILED_PRECONDITION: Code = Code(9);
    /// `OUT_OF_RANGE` (11): an argument past the valid range.
    pub const OUT_OF_RANGE: Code = Code(11);
    /// `UNIMPLEMENTED` (12): the server does not implement or support the method.
    pub const UNIMPLEMENTED: Code = Code(12);
    /// `INTERNAL` (13): an invariant of the server or the protocol broke.
    pub const INTERNAL: Code = Code(13);
    /// `UNAVAILABLE` (14): the service cannot be reached for now (e.g. the backend is down);
    /// the call may be retried.
    pub const UNAVAILABLE: Code = Code(14);
    /// `UNAUTHENTICATED` (16): the caller has no valid credentials.
    pub const UNAUTHENTICATED: Code = Code(16);

    /// The canonical upper-case name (`NOT_FOUND`), or `OUT_OF_SPEC` for codes outside 0..=16.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("OUT_OF_SPEC")
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A call's status: code plus a human-readable message. For statuses this project answers
/// itself, the message names what failed (the CRI method, the backend socket, the hook stage
/// and server, the plugin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The status code (`grpc-status`).
    pub code: Code,
    /// The message as text (`grpc-message`, percent-encoded only on the HTTP/2 wire); may be
    /// empty.
    pub message: String,
}

impl Status {
    /// A status of `code` with `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status { code, message: message.into() }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

impl From<Status> for tonic::Status {
    /// The same code and message; a code outside 0..=16 becomes `UNKNOWN` (tonic has no other).
    fn from(s: Status) -> tonic::Status {
        tonic::Status::new(tonic::Code::from(i32::from(s.code.0)), s.message)
    }
}

impl From<tonic::Status> for Status {
    /// The same code and message (tonic's `Code` is `google.rpc.Code`).
    fn from(s: tonic::Status) -> Status {
        Status::new(Code(s.code() as u16), s.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_conversions() {
        assert_eq!(Code::FAILED_PRECONDITION.name(), "FAILED_PRECONDITION");
        assert_eq!(Code(15).name(), "DATA_LOSS");
        assert_eq!(Code(17).name(), "OUT_OF_SPEC");
        let t: tonic::Status = Status::new(Code::FAILED_PRECONDITION, "two servers set cpu_shares").into();
        assert_eq!((t.code(), t.message()), (tonic::Code::FailedPrecondition, "two servers set cpu_shares"));
        let t: tonic::Status = Status::new(Code(42), "x").into();
        assert_eq!(t.code(), tonic::Code::Unknown);
        assert_eq!(Status::from(tonic::Status::internal("m")), Status::new(Code::INTERNAL, "m"));
        assert_eq!(Status::new(Code::NOT_FOUND, "pod p").to_string(), "NOT_FOUND: pod p");
    }
}
