//! The node's options the built-in plugins are built with ([`PluginOptions`]), apart from the
//! plugins' facade so that a plugin reads them without importing the list of plugins.

/// The node's options the plugins are built with (the command line's and the gates').
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginOptions {
    /// Where the device plugins read the host (`--device-host-root`) and the HAMi-core library.
    pub devices: super::devices::DeviceOptions,
    /// koordlet's `BECPUManager` gate: CPUSet gives NUMA-aware BE pods the NodeResourceTopology's
    /// BE share pools (off: BE pods are left to the CPU suppress policy, their cpuset cleared).
    pub be_cpu_manager: bool,
    /// The node-level work sees only the pods `--selector` selects: plugins must not remove
    /// what may belong to the others (Resctrl's groups).
    pub partial_view: bool,
    /// Where GroupIdentity reads the kernel's group identity switch in the hook path
    /// (`/proc/sys`); empty: not read (taken as absent).
    pub proc_sys: std::path::PathBuf,
}
