//! runtime-hooks: the hook-server half of runtime-proxy, in the role of koordlet's runtime hooks
//! (work in progress: more modules follow).

#![warn(missing_docs)]

pub mod cgroup;
pub mod change;
pub mod context;
pub mod plugin;
pub mod plugins;
pub mod quantity;
pub mod rules;
pub mod framework;
