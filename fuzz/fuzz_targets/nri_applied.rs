//! What of an NRI update a container holds already (`nri_plugin::applied`): for any wanted and held
//! resources, never a panic; what `unapplied` sends, once applied over what the container held,
//! leaves nothing to send; and what it sends is only fields the update sets.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use nri_plugin::applied::{applied, unapplied};
use nri_plugin::proto::api as nri;

#[derive(Arbitrary, Debug)]
struct Values {
    shares: Option<u64>,
    quota: Option<i64>,
    period: Option<u64>,
    cpus: String,
    mems: String,
    limit: Option<i64>,
    swap: Option<i64>,
    unified: Vec<(String, String)>,
    rdt: Option<String>,
}

impl Values {
    fn nri(self) -> nri::LinuxResources {
        nri::LinuxResources {
            cpu: Some(nri::LinuxCpu {
                shares: self.shares.map(|value| nri::OptionalUInt64 { value }),
                quota: self.quota.map(|value| nri::OptionalInt64 { value }),
                period: self.period.map(|value| nri::OptionalUInt64 { value }),
                cpus: self.cpus,
                mems: self.mems,
                ..Default::default()
            }),
            memory: Some(nri::LinuxMemory {
                limit: self.limit.map(|value| nri::OptionalInt64 { value }),
                swap: self.swap.map(|value| nri::OptionalInt64 { value }),
                ..Default::default()
            }),
            unified: self.unified.into_iter().collect(),
            rdt_class: self.rdt.map(|value| nri::OptionalString { value }),
            ..Default::default()
        }
    }
}

fuzz_target!(|input: (Values, Option<Values>)| {
    let (want, have) = (input.0.nri(), input.1.map(Values::nri));
    let Some(sent) = unapplied(&want, have.as_ref()) else { return };
    let now = applied(have.as_ref(), &sent);
    assert_eq!(unapplied(&want, Some(&now)), None, "applied what was sent, nothing is left: {sent:?}");
    let (w, s) = (want.cpu.unwrap_or_default(), sent.cpu.unwrap_or_default());
    assert!(s.shares.is_none() || s.shares == w.shares);
    assert!(s.cpus.is_empty() || s.cpus == w.cpus);
    assert!(sent.unified.iter().all(|(k, v)| want.unified.get(k) == Some(v)));
});
