//! runtime-hooks' NRI mode on nodes of 10, 100 and 1,000 pods × 4 containers (the pod mix of
//! `test_support::scale`: half BE, 4 in 10 LS, 1 in 10 LSR), against the NRI runtime stand-in
//! (`test_support::nri_runtime`, NRI 0.12, Synchronize split as NRI splits it), the pod cgroups in
//! a v1 tree in a temp directory. For each size:
//!
//! * **Synchronize, fresh**: the containers hold kubelet's values; the messages' sizes and parts,
//!   the updates answered (only what differs), the time from the first part sent to the answer,
//!   and runtime-hooks' CPU time for it;
//! * **Synchronize, again**: runtime-hooks connects again to a runtime that applied those
//!   updates (as after a restart of runtime-hooks): the same figures, with no update to answer;
//! * **per pod created**: runtime-hooks' CPU per new pod (RunPodSandbox, CreateContainer,
//!   StartContainer, PostStartContainer of one container) and per pod removed (StopContainer,
//!   RemoveContainer, StopPodSandbox, RemovePodSandbox), over `RP_BENCH_SCALE_EVENTS` pods
//!   (default 200) — flat when no per-event work grows with the node.
//!
//! CPU time is the sum of runtime-hooks' threads' time on CPU (`/proc/PID/task/*/schedstat`,
//! nanoseconds), independent of how this VM wakes idle CPUs.
//!
//! Run: `make bench`, or `cargo bench -p runtime-hooks --bench large_node` (no runtime needed).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::start_nri_v1;
use nri_plugin::proto::api::Event;
use test_support::nri_runtime::{Delivered, NriRuntime};
use test_support::scale;

const SIZES: [usize; 3] = [10, 100, 1000];
const PER_POD: usize = 4;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

struct Row {
    pods: usize,
    what: &'static str,
    parts: usize,
    request_kib: f64,
    answer_kib: f64,
    updates: usize,
    wall_ms: f64,
    cpu_ms: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let events: usize = std::env::var("RP_BENCH_SCALE_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let (mut rows, mut per_event) = (Vec::new(), Vec::new());
    for pods in SIZES {
        let dir = tempfile::Builder::new().prefix("rh-large-node").tempdir().unwrap();
        let (all_pods, mut containers) = scale::nri_node(pods, PER_POD);
        let extra: Vec<_> = (pods..pods + events).map(|i| scale::nri_pod(i, 1)).collect();
        scale::cgroup_v1_tree(&dir.path().join("cgroup"), &all_pods).unwrap();
        scale::cgroup_v1_tree(&dir.path().join("cgroup"), &extra).unwrap();
        let runtime = NriRuntime::v0_12().unwrap();
        let hooks = start_nri_v1(runtime.socket(), dir.path(), "warn");
        let pid = hooks.pid();
        for what in ["Synchronize, fresh", "Synchronize, again"] {
            let before = test_support::cpu_ns(pid);
            let plugin = runtime
                .accept(all_pods.clone(), containers.clone())
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", hooks.log()));
            let cpu = test_support::cpu_ns(pid) - before;
            rows.push(Row {
                pods,
                what,
                parts: plugin.sync.request_bytes.len(),
                request_kib: plugin.sync.request_bytes.iter().sum::<usize>() as f64 / 1024.0,
                answer_kib: plugin.sync.answer_bytes as f64 / 1024.0,
                updates: plugin.sync.answered.len(),
                wall_ms: plugin.sync.elapsed.as_secs_f64() * 1e3,
                cpu_ms: ms(cpu),
            });
            scale::updated(&mut containers, &plugin.sync.answered);
            if what == "Synchronize, fresh" {
                plugin.close().await;
                continue;
            }
            // Pods created and removed on the node of this size.
            let mut plugin = plugin;
            let create =
                [Event::RunPodSandbox, Event::CreateContainer, Event::StartContainer, Event::PostStartContainer];
            let remove = [Event::StopContainer, Event::RemoveContainer, Event::StopPodSandbox, Event::RemovePodSandbox];
            let mut cpu = [0u64; 2];
            for (n, events_of) in [create, remove].iter().enumerate() {
                let before = test_support::cpu_ns(pid);
                for (i, pod) in extra.iter().enumerate() {
                    let c = scale::nri_container(pods + i, 0, pod);
                    for event in events_of {
                        let container = (!test_support::nri_runtime::pod_level(*event)).then_some(&c);
                        match plugin.deliver(*event, pod, container).await.unwrap() {
                            Ok(Delivered::Answered(..) | Delivered::NotSubscribed) => {}
                            Err(s) => panic!("{event:?}: {s:?}\n{}", hooks.log()),
                        }
                    }
                }
                cpu[n] = test_support::cpu_ns(pid) - before;
            }
            per_event.push((pods, cpu[0] as f64 / events as f64 / 1e3, cpu[1] as f64 / events as f64 / 1e3));
            plugin.close().await;
        }
        drop(hooks);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("runtime-hooks NRI mode on a large node ({PER_POD} containers per pod; stand-in runtime, NRI 0.12)\n");
    println!(
        "| pods | containers | call | parts | request KiB | answer KiB | updates | wall ms | runtime-hooks CPU ms |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.1} | {} | {:.1} | {:.1} |",
            r.pods,
            r.pods * PER_POD,
            r.what,
            r.parts,
            r.request_kib,
            r.answer_kib,
            r.updates,
            r.wall_ms,
            r.cpu_ms
        );
    }
    println!("\n| pods on the node | CPU per pod created (µs) | CPU per pod removed (µs) |");
    println!("|---:|---:|---:|");
    for (pods, create, remove) in per_event {
        println!("| {pods} | {create:.0} | {remove:.0} |");
    }
    println!("\n({events} pods created and removed per size: RP_BENCH_SCALE_EVENTS)");
}
