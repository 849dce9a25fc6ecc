//! Traffic control on one network interface: an HTB root qdisc, HTB classes and `cgroup`
//! filters, the kernel objects koordlet's TCNetworkQoS hook keeps (`hooks/tc/tc_linux.go`).
//!
//! [`TrafficControl`] is the facility; [`Netlink`] implements it over rtnetlink
//! (`netlink-packet-route` messages on a `netlink-sys` socket — no `tc` binary); tests use
//! [`FakeTc`]. Handles are `major << 16 | minor` (`1:3` is `0x10003`), rates bytes per second.
//!
//! HTB's options are not modelled by `netlink-packet-route`, so they are encoded here from the
//! kernel's UAPI (`linux/pkt_sched.h`): `TCA_HTB_INIT` (`struct tc_htb_glob`) for the qdisc,
//! `TCA_HTB_PARMS` (`struct tc_htb_opt`, link layer Ethernet so that no rate tables are needed)
//! plus `TCA_HTB_RATE64`/`TCA_HTB_CEIL64` above 2³² − 1 bytes/s for classes. Buffers are
//! computed as `tc` does: `rate / HZ + 1600` bytes as transmission time in scheduler ticks
//! (`/proc/net/psched`).

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use netlink_packet_core::{
    DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use netlink_packet_route::route::{RouteAttribute, RouteHeader, RouteMessage};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// An HTB class: what koordlet's `newClass` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HtbClass {
    /// Class handle (`0x10003` = `1:3`).
    pub handle: u32,
    /// Parent handle (the qdisc's root `0xffffffff` for `1:1`, else `0x10001`).
    pub parent: u32,
    /// Guaranteed rate, bytes/s (> 0; the kernel refuses 0).
    pub rate: u64,
    /// Maximum rate when borrowing, bytes/s (> 0).
    pub ceil: u64,
    /// Priority among siblings, 0..=7, lower first.
    pub prio: u32,
}

/// The interface's root qdisc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootQdisc {
    /// Its kind (`htb`, `noqueue`, `mq`, `fq_codel`, …).
    pub kind: String,
    /// Its handle (`0x10000` = `1:`).
    pub handle: u32,
}

/// A filter attached to a qdisc.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Filter {
    /// Parent (the qdisc's handle, `0x10000`).
    pub parent: u32,
    /// Priority (tc's `pref`).
    pub prio: u16,
    /// Classifier kind (`cgroup`, `u32`, …).
    pub kind: String,
    /// Filter handle.
    pub handle: u32,
}

/// Traffic control on one interface (see the module documentation). Every call is one
/// request to the kernel.
///
/// Errors: the kernel's (`EPERM` without `CAP_NET_ADMIN`, `ENOENT` for a classifier this kernel
/// lacks — `cls_cgroup` here, `EINVAL` for a rate of 0, …), as [`io::Error`]s.
pub trait TrafficControl: Send + Sync {
    /// The interface name (`eth0`).
    fn interface(&self) -> &str;
    /// The root qdisc, `None` when there is none.
    fn root_qdisc(&self) -> io::Result<Option<RootQdisc>>;
    /// Replaces the root qdisc with HTB `handle` (`0x10000`) sending unclassified traffic to
    /// `default_minor` (tc's `default`).
    fn replace_root_htb(&self, handle: u32, default_minor: u32) -> io::Result<()>;
    /// Deletes the root qdisc `handle` (with its classes and filters).
    fn delete_root_qdisc(&self, handle: u32) -> io::Result<()>;
    /// The HTB classes.
    fn classes(&self) -> io::Result<Vec<HtbClass>>;
    /// Creates the class, or changes it when its handle exists.
    fn put_class(&self, class: &HtbClass) -> io::Result<()>;
    /// Deletes the class `handle` under `parent`.
    fn delete_class(&self, parent: u32, handle: u32) -> io::Result<()>;
    /// The filters under `parent`.
    fn filters(&self, parent: u32) -> io::Result<Vec<Filter>>;
    /// Adds a `cgroup` filter (IPv4; classifies by the sending socket's `net_cls.classid`) at
    /// `prio` with `handle` under `parent` (tc: `filter add … parent 1: protocol ip prio P
    /// handle H: cgroup`).
    fn add_cgroup_filter(&self, parent: u32, prio: u16, handle: u32) -> io::Result<()>;
}

/// [`TrafficControl`] over rtnetlink on the current network namespace.
pub struct Netlink {
    name: String,
    index: i32,
    socket: Mutex<Socket>,
    seq: AtomicU32,
    /// Scheduler ticks per µs and HZ (`/proc/net/psched`), for HTB buffers.
    tick_in_usec: f64,
    hz: f64,
}

const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_INIT: u16 = 2;
const TCA_HTB_RATE64: u16 = 6;
const TCA_HTB_CEIL64: u16 = 7;
const TC_HTB_PROTOVER: u32 = 3;
const TC_LINKLAYER_ETHERNET: u8 = 1;
const MTU: f64 = 1600.0;
const ETH_P_IP: u16 = 0x0800;

impl Netlink {
    /// Opens a netlink socket for `interface`.
    ///
    /// Errors: no such interface (`NotFound`), the socket cannot be opened.
    pub fn open(interface: &str) -> io::Result<Netlink> {
        let cname = std::ffi::CString::new(interface)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        // SAFETY: a valid NUL-terminated string; if_nametoindex only reads it.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no network interface {interface:?}")));
        }
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let (tick_in_usec, hz) = psched();
        Ok(Netlink {
            name: interface.to_owned(),
            index: index as i32,
            socket: Mutex::new(socket),
            seq: AtomicU32::new(1),
            tick_in_usec,
            hz,
        })
    }

    /// The interface of the IPv4 default route in the main table (koordlet's
    /// `GetLinkInfoByDefaultRoute`), `None` when there is no default route.
    ///
    /// Errors: netlink.
    pub fn default_route_interface() -> io::Result<Option<String>> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        let replies = exchange(&socket, 1, RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)?;
        for reply in replies {
            let RouteNetlinkMessage::NewRoute(r) = reply else { continue };
            if r.header.destination_prefix_length != 0 || r.header.table != RouteHeader::RT_TABLE_MAIN {
                continue;
            }
            if let Some(index) =
                r.attributes.iter().find_map(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None })
            {
                let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
                // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires.
                let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
                if !p.is_null() {
                    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
                    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
                    return Ok(Some(name.to_string_lossy().into_owned()));
                }
            }
        }
        Ok(None)
    }

    fn tc(&self, handle: u32, parent: u32, info: u32, attrs: Vec<TcAttribute>) -> TcMessage {
        let mut m = TcMessage::with_index(self.index);
        m.header.handle = TcHandle::from(handle);
        m.header.parent = TcHandle::from(parent);
        m.header.info = info;
        m.attributes = attrs;
        m
    }

    fn call(&self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let socket = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        exchange(&socket, seq, msg, flags)
    }

    /// Transmission time of `bytes` at `rate` bytes/s in scheduler ticks (tc's `tc_calc_xmittime`).
    fn xmittime(&self, rate: u64, bytes: f64) -> u32 {
        (1_000_000.0 * bytes / rate.max(1) as f64 * self.tick_in_usec).min(u32::MAX as f64) as u32
    }
}

/// `(tick_in_usec, hz)` from `/proc/net/psched` (iproute2's reading), else the values of every
/// current kernel (15.625, 1e9).
fn psched() -> (f64, f64) {
    let text = std::fs::read_to_string("/proc/net/psched").unwrap_or_default();
    let v: Vec<u32> = text.split_whitespace().filter_map(|w| u32::from_str_radix(w, 16).ok()).collect();
    match v[..] {
        [t2us, us2t, clock_res, hz, ..] if us2t != 0 => {
            let tick = t2us as f64 / us2t as f64 * (clock_res as f64 / 1_000_000.0);
            (tick, if clock_res == 1_000_000 && hz > 0 { hz as f64 } else { 1000.0 })
        }
        _ => (15.625, 1e9),
    }
}

/// Sends one request and collects the replies of its sequence number up to the ACK or DONE.
fn exchange(socket: &Socket, seq: u32, msg: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = seq;
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    nl.finalize();
    let mut buf = vec![0u8; nl.buffer_len()];
    nl.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut out = Vec::new();
    loop {
        let (data, _) = socket.recv_from_full()?;
        let mut off = 0;
        while off + 16 <= data.len() {
            let len = u32::from_ne_bytes([data[off], data[off + 1], data[off + 2], data[off + 3]]) as usize;
            if len < 16 || off + len > data.len() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "truncated netlink message"));
            }
            let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..off + len])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("netlink reply: {e}")))?;
            off += (len + 3) & !3;
            if m.header.sequence_number != seq {
                continue;
            }
            match m.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) if e.code.is_none() => return Ok(out),
                NetlinkPayload::Error(e) => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(i) => out.push(i),
                _ => {}
            }
        }
    }
}

fn kind_of(attrs: &[TcAttribute]) -> String {
    attrs.iter().find_map(|a| if let TcAttribute::Kind(k) = a { Some(k.clone()) } else { None }).unwrap_or_default()
}

fn nla_bytes(nla: &DefaultNla) -> Vec<u8> {
    use netlink_packet_core::Nla;
    let mut b = vec![0u8; nla.value_len()];
    nla.emit_value(&mut b);
    b
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8]) -> Option<u64> {
    b.get(..8).map(|s| u64::from_ne_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]))
}

/// The attributes (`(type, value)`) packed in a nested attribute's value.
fn nested_nlas(b: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= b.len() {
        let len = u16::from_ne_bytes([b[off], b[off + 1]]) as usize;
        let kind = u16::from_ne_bytes([b[off + 2], b[off + 3]]) & 0x3fff;
        if len < 4 || off + len > b.len() {
            break;
        }
        out.push((kind, b[off + 4..off + len].to_vec()));
        off += (len + 3) & !3;
    }
    out
}

/// `struct tc_ratespec` for `rate` bytes/s (capped at 2³² − 1; the 64-bit attribute carries more).
fn ratespec(rate: u64) -> [u8; 12] {
    let mut r = [0u8; 12];
    r[1] = TC_LINKLAYER_ETHERNET;
    r[8..12].copy_from_slice(&(rate.min(u32::MAX as u64) as u32).to_ne_bytes());
    r
}

impl TrafficControl for Netlink {
    fn interface(&self) -> &str {
        &self.name
    }

    fn root_qdisc(&self) -> io::Result<Option<RootQdisc>> {
        let replies =
            self.call(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(self.index)), NLM_F_DUMP)?;
        Ok(replies.into_iter().find_map(|r| match r {
            RouteNetlinkMessage::NewQueueDiscipline(m)
                if m.header.index == self.index && m.header.parent == TcHandle::ROOT =>
            {
                Some(RootQdisc { kind: kind_of(&m.attributes), handle: m.header.handle.into() })
            }
            _ => None,
        }))
    }

    fn replace_root_htb(&self, handle: u32, default_minor: u32) -> io::Result<()> {
        let mut glob = Vec::with_capacity(20);
        for v in [TC_HTB_PROTOVER, 10, default_minor, 0, 0] {
            glob.extend_from_slice(&v.to_ne_bytes());
        }
        let attrs = vec![
            TcAttribute::Kind("htb".into()),
            TcAttribute::Options(vec![TcOption::Other(DefaultNla::new(TCA_HTB_INIT, glob))]),
        ];
        let msg = self.tc(handle, TcHandle::ROOT.into(), 0, attrs);
        self.call(RouteNetlinkMessage::NewQueueDiscipline(msg), NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE).map(drop)
    }

    fn delete_root_qdisc(&self, handle: u32) -> io::Result<()> {
        let msg = self.tc(handle, TcHandle::ROOT.into(), 0, Vec::new());
        self.call(RouteNetlinkMessage::DelQueueDiscipline(msg), NLM_F_ACK).map(drop)
    }

    fn classes(&self) -> io::Result<Vec<HtbClass>> {
        let replies = self.call(RouteNetlinkMessage::GetTrafficClass(TcMessage::with_index(self.index)), NLM_F_DUMP)?;
        let mut out = Vec::new();
        for r in replies {
            let RouteNetlinkMessage::NewTrafficClass(m) = r else { continue };
            if m.header.index != self.index || kind_of(&m.attributes) != "htb" {
                continue;
            }
            let mut class =
                HtbClass { handle: m.header.handle.into(), parent: m.header.parent.into(), rate: 0, ceil: 0, prio: 0 };
            // netlink-packet-route keeps an unknown kind's TCA_OPTIONS whole: the HTB attributes
            // are nested inside.
            let nested: Vec<(u16, Vec<u8>)> = m
                .attributes
                .iter()
                .filter_map(|a| if let TcAttribute::Options(o) = a { Some(o) } else { None })
                .flatten()
                .filter_map(|o| if let TcOption::Other(nla) = o { Some(nla_bytes(nla)) } else { None })
                .flat_map(|b| nested_nlas(&b))
                .collect();
            let (mut rate64, mut ceil64) = (None, None);
            for (kind, b) in nested {
                match kind {
                    TCA_HTB_PARMS => {
                        class.rate = u32_at(&b, 8).unwrap_or(0) as u64;
                        class.ceil = u32_at(&b, 20).unwrap_or(0) as u64;
                        class.prio = u32_at(&b, 40).unwrap_or(0);
                    }
                    TCA_HTB_RATE64 => rate64 = u64_at(&b),
                    TCA_HTB_CEIL64 => ceil64 = u64_at(&b),
                    _ => {}
                }
            }
            class.rate = rate64.unwrap_or(class.rate);
            class.ceil = ceil64.unwrap_or(class.ceil);
            out.push(class);
        }
        Ok(out)
    }

    fn put_class(&self, class: &HtbClass) -> io::Result<()> {
        let buffer = self.xmittime(class.rate, class.rate as f64 / self.hz + MTU);
        let cbuffer = self.xmittime(class.ceil, class.ceil as f64 / self.hz + MTU);
        let mut opt = Vec::with_capacity(44);
        opt.extend_from_slice(&ratespec(class.rate));
        opt.extend_from_slice(&ratespec(class.ceil));
        for v in [buffer, cbuffer, 0, 0, class.prio] {
            opt.extend_from_slice(&v.to_ne_bytes());
        }
        let mut opts = Vec::new();
        if class.rate > u32::MAX as u64 {
            opts.push(TcOption::Other(DefaultNla::new(TCA_HTB_RATE64, class.rate.to_ne_bytes().to_vec())));
        }
        if class.ceil > u32::MAX as u64 {
            opts.push(TcOption::Other(DefaultNla::new(TCA_HTB_CEIL64, class.ceil.to_ne_bytes().to_vec())));
        }
        opts.push(TcOption::Other(DefaultNla::new(TCA_HTB_PARMS, opt)));
        let msg =
            self.tc(class.handle, class.parent, 0, vec![TcAttribute::Kind("htb".into()), TcAttribute::Options(opts)]);
        self.call(RouteNetlinkMessage::NewTrafficClass(msg), NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE).map(drop)
    }

    fn delete_class(&self, parent: u32, handle: u32) -> io::Result<()> {
        let msg = self.tc(handle, parent, 0, Vec::new());
        self.call(RouteNetlinkMessage::DelTrafficClass(msg), NLM_F_ACK).map(drop)
    }

    fn filters(&self, parent: u32) -> io::Result<Vec<Filter>> {
        let msg = self.tc(0, parent, 0, Vec::new());
        let replies = self.call(RouteNetlinkMessage::GetTrafficFilter(msg), NLM_F_DUMP)?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewTrafficFilter(m) if m.header.index == self.index => Some(Filter {
                    parent: m.header.parent.into(),
                    prio: (m.header.info >> 16) as u16,
                    kind: kind_of(&m.attributes),
                    handle: m.header.handle.into(),
                }),
                _ => None,
            })
            .collect())
    }

    fn add_cgroup_filter(&self, parent: u32, prio: u16, handle: u32) -> io::Result<()> {
        let info = ((prio as u32) << 16) | ETH_P_IP.to_be() as u32;
        let attrs = vec![TcAttribute::Kind("cgroup".into()), TcAttribute::Options(Vec::new())];
        let msg = self.tc(handle, parent, info, attrs);
        self.call(RouteNetlinkMessage::NewTrafficFilter(msg), NLM_F_ACK | NLM_F_CREATE).map(drop)
    }
}

/// An in-memory [`TrafficControl`] for tests: records the calls' effects; `fail_filters`
/// makes filter creation fail as on a kernel without `cls_cgroup`.
#[derive(Debug, Default)]
pub struct FakeTc {
    /// The root qdisc.
    pub qdisc: Mutex<Option<RootQdisc>>,
    /// The classes, by handle order of creation.
    pub classes: Mutex<Vec<HtbClass>>,
    /// The filters.
    pub filters: Mutex<Vec<Filter>>,
    /// Refuse `add_cgroup_filter` with `ENOENT`.
    pub fail_filters: bool,
}

impl TrafficControl for FakeTc {
    fn interface(&self) -> &str {
        "fake0"
    }
    fn root_qdisc(&self) -> io::Result<Option<RootQdisc>> {
        Ok(self.qdisc.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn replace_root_htb(&self, handle: u32, _default_minor: u32) -> io::Result<()> {
        *self.qdisc.lock().unwrap_or_else(|e| e.into_inner()) = Some(RootQdisc { kind: "htb".into(), handle });
        self.classes.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.filters.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }
    fn delete_root_qdisc(&self, _handle: u32) -> io::Result<()> {
        *self.qdisc.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.classes.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.filters.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }
    fn classes(&self) -> io::Result<Vec<HtbClass>> {
        Ok(self.classes.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn put_class(&self, class: &HtbClass) -> io::Result<()> {
        if class.rate == 0 || class.ceil == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        classes.retain(|c| c.handle != class.handle);
        classes.push(*class);
        Ok(())
    }
    fn delete_class(&self, _parent: u32, handle: u32) -> io::Result<()> {
        self.classes.lock().unwrap_or_else(|e| e.into_inner()).retain(|c| c.handle != handle);
        Ok(())
    }
    fn filters(&self, parent: u32) -> io::Result<Vec<Filter>> {
        Ok(self
            .filters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|f| f.parent == parent)
            .cloned()
            .collect())
    }
    fn add_cgroup_filter(&self, parent: u32, prio: u16, handle: u32) -> io::Result<()> {
        if self.fail_filters {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        self.filters.lock().unwrap_or_else(|e| e.into_inner()).push(Filter {
            parent,
            prio,
            kind: "cgroup".into(),
            handle,
        });
        Ok(())
    }
}
