//! The global allocator of both daemons: mimalloc, instead of the C library's malloc.
//!
//! Why: a hooked call allocates a few hundred small blocks (the decoded hook fields, the hook
//! request's maps, the store's copy of the container), and glibc's `malloc`/`free` were a
//! quarter of the proxy's instructions per hooked CreateContainer (about 41,000 of 158,000,
//! callgrind; docs/benchmarks.md). mimalloc's thread-local free lists serve the same blocks in
//! a fraction of that, with no system call in the steady state.
//!
//! Each binary installs it in its `main.rs`:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: daemon_support::alloc::Allocator = daemon_support::alloc::Allocator;
//! ```
//!
//! Libraries and tests keep the default allocator; only the two daemons' binaries change.

/// The allocator type the daemons install as `#[global_allocator]` (mimalloc, built with its
/// default options: no secure mode, no override of the C library's `malloc`).
pub use mimalloc::MiMalloc as Allocator;
