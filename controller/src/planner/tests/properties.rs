//! Properties: permuting the input never changes the slices, the plans or their revisions.

use proptest::prelude::*;

use super::{all_objects, plan};
use crate::planner::{
    Snapshot,
    fixtures::{EndpointExt, ServiceExt, endpoint, service, slice_named, three_nodes},
};

fn cluster() -> Snapshot {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..12u8 {
        let name = format!("svc{i}");
        services.push(service("ns1", &name, &format!("10.96.0.{}", i + 1), |s| {
            s.port("http", 80, "TCP").port("dns", 53, "UDP");
            if i % 3 == 0 {
                s.spec_mut().internal_traffic_policy = Some("Local".into());
            }
            if i % 4 == 0 {
                s.type_("NodePort").node_port("np", 8080, 30000 + i32::from(i));
                s.spec_mut().external_traffic_policy = Some("Local".into());
            }
        }));
        for half in 0..2u8 {
            let nodes = ["node-a", "node-b", "node-c"];
            let eps = (0..3u8)
                .map(|j| {
                    let ep = endpoint(
                        &format!("10.244.{}.{}", j + 1, i * 8 + half * 4 + 1),
                        nodes[j as usize],
                    );
                    let ep = if (i + j) % 5 == 0 {
                        ep.conditions(false, true, true)
                    } else {
                        ep
                    };
                    if i % 2 == 0 {
                        ep.zone_hints(&[if j == 2 { "zone-b" } else { "zone-a" }])
                    } else {
                        ep
                    }
                })
                .collect();
            slices.push(slice_named(
                "ns1",
                &name,
                &format!("{name}-{half}"),
                "IPv4",
                &[("http", 8080, "TCP"), ("dns", 53, "UDP"), ("np", 8080, "TCP")],
                eps,
            ));
        }
    }
    Snapshot {
        services,
        slices,
        nodes: three_nodes(),
    }
}

fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn permuting_the_input_never_changes_plans(a in any::<u64>(), b in any::<u64>(), c in any::<u64>()) {
        let reference = all_objects(&plan(&cluster()));
        let mut shuffled = cluster();
        shuffle(&mut shuffled.services, a);
        shuffle(&mut shuffled.slices, b);
        shuffle(&mut shuffled.nodes, c);
        for s in &mut shuffled.slices {
            if let Some(eps) = s.endpoints.as_mut() {
                shuffle(eps, a ^ c);
            }
        }
        prop_assert_eq!(all_objects(&plan(&shuffled)), reference);
    }
}
