//! Clearing the connections of an endpoint that left its Service (issue 23), on the real kernel: N
//! established TCP flows DNATed from a ClusterIP to one endpoint, plus N/10 to another endpoint of the
//! same Service, loaded into a fresh network namespace's conntrack table (`conntrack -R`, one batch);
//! then the agent's own `CliConntrack::delete_matching` of the removed endpoint's filter, timed. It runs
//! on the agent's conntrack worker right after the rules are applied: its time is how long the
//! clearing trails the apply.
//! Then the same with 20,000 filters, all but one for endpoints without flows (a change that replaces
//! every endpoint of thousands of Services): `clear_removed` lists the table once and runs only the
//! filter that matches.
//!
//! ```text
//! SWITCHYARD_BENCH_CONNTRACK_FLOWS=100000 cargo bench -p switchyard-agent --bench conntrack_clear   (root)
//! ```
//!
//! Default 10,000 and 100,000 flows (SWITCHYARD_BENCH_SMOKE=1: 1,000). Needs root and conntrack-tools.

mod common;

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use switchyard_agent::conntrack::{CliConntrack, Conntrack, EndpointFlows, clear_removed};
use switchyard_api::{IpFamily, Protocol};

use common::{Netns, ms, root_bench_main, smoke, target};

/// The flows of a removed endpoint should be gone within this of the apply.
const TARGET: Duration = Duration::from_secs(1);
const TARGET_FLOWS: usize = 100_000;
/// A change replacing every endpoint of 10,000 Services: ~50,000 filters; 20,000 here.
const MANY_FILTERS: usize = 20_000;

/// `conntrack -R` input: `count` established flows from distinct client ports to 10.96.0.10:80,
/// DNATed to `endpoint`:8080.
fn flows(count: usize, endpoint: &str, first_client: u32) -> String {
    let mut out = String::new();
    for i in 0..count as u32 {
        let client = first_client + i / 60_000;
        let port = 1024 + i % 60_000;
        let client = format!("10.244.{}.{}", client / 256, client % 256);
        let _ = writeln!(
            out,
            "-I -p tcp -s {client} -d 10.96.0.10 --sport {port} --dport 80 -r {endpoint} -q {client} \
             --reply-port-src 8080 --reply-port-dst {port} --state ESTABLISHED -t 3600 -u ASSURED"
        );
    }
    out
}

/// Filters for endpoints that have no flow: what a change replacing many endpoints adds beside the
/// one that has flows.
fn decoys(n: usize) -> Vec<EndpointFlows> {
    (0..n as u32)
        .map(|i| EndpointFlows {
            protocol: Protocol::TCP,
            family: IpFamily::IPv4,
            frontend: Some(std::net::Ipv4Addr::new(10, 96, (i / 256) as u8 + 1, (i % 256) as u8).into()),
            port: 80,
            endpoint: std::net::Ipv4Addr::new(10, 245, (i / 256) as u8, (i % 256) as u8).into(),
            endpoint_port: Some(8080),
        })
        .collect()
}

/// `count` flows of the removed endpoint cleared with `filters` filters in all (the rest decoys):
/// one filter is `delete_matching`; more is `clear_removed`, which lists the table first.
fn one(count: usize, filters: usize) -> Result<(Duration, u64), String> {
    let netns = Netns::new("ct")?;
    let dir = switchyard_test_support::scratch::dir("bench-ct").map_err(|e| e.to_string())?;
    let file = dir.path().join("flows");
    let others = count / 10;
    let text = flows(count, "10.244.2.5", 256) + &flows(others, "10.244.2.6", 512);
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let loaded = netns.exec(&format!(
        "conntrack -R {} >/dev/null 2>&1; conntrack -C",
        file.display()
    ));
    drop(dir);
    let loaded: usize = loaded?.trim().parse().map_err(|e| format!("conntrack -C: {e}"))?;
    if loaded != count + others {
        return Err(format!(
            "loaded {loaded} flows, wanted {} (nf_conntrack_max too small?)",
            count + others
        ));
    }
    let filter = EndpointFlows {
        protocol: Protocol::TCP,
        family: IpFamily::IPv4,
        frontend: Some("10.96.0.10".parse().map_err(|_| "address")?),
        port: 80,
        endpoint: "10.244.2.5".parse().map_err(|_| "address")?,
        endpoint_port: Some(8080),
    };
    let (took, cleared) = netns.within(move || {
        let mut conntrack = CliConntrack::default();
        let started = Instant::now();
        let cleared = if filters <= 1 {
            conntrack.delete_matching(&filter).map_err(|e| e.to_string())?
        } else {
            let mut all = decoys(filters - 1);
            all.push(filter);
            let (cleared, run) = clear_removed(&mut conntrack, &all).map_err(|e| e.to_string())?;
            if run != 1 {
                return Err(format!("{run} filters run, wanted only the one with flows"));
            }
            cleared
        };
        Ok((started.elapsed(), cleared))
    })?;
    let left: usize = netns
        .exec("conntrack -C")?
        .trim()
        .parse()
        .map_err(|e| format!("conntrack -C: {e}"))?;
    if cleared != count as u64 || left != others {
        return Err(format!(
            "cleared {cleared} of {count}, {left} left of the other endpoint's {others}"
        ));
    }
    Ok((took, cleared))
}

fn main() -> ExitCode {
    root_bench_main("conntrack_clear", "conntrack clearing benchmark", || {
        let counts: Vec<usize> = match std::env::var("SWITCHYARD_BENCH_CONNTRACK_FLOWS") {
            Ok(list) => list
                .split(',')
                .map(|n| n.trim().parse().map_err(|e| format!("{n:?}: {e}")))
                .collect::<Result<_, String>>()?,
            Err(_) if smoke() => vec![1_000],
            Err(_) => vec![10_000, TARGET_FLOWS],
        };
        println!("flows of the endpoint | filters | cleared | time");
        for count in counts {
            for filters in [1, MANY_FILTERS] {
                let (took, cleared) = one(count, filters)?;
                println!("{count:>21} | {filters:>7} | {cleared:>7} | {}", ms(took));
                if count == TARGET_FLOWS {
                    let what = if filters == 1 {
                        "clearing 100,000 flows of a removed endpoint (after the apply, on the worker)"
                            .to_string()
                    } else {
                        format!("the same among {filters} filters of removed endpoints (list first)")
                    };
                    target(&what, &ms(took), "≤ 1 s", took <= TARGET);
                }
            }
        }
        Ok(())
    })
}
