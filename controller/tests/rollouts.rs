//! A ForwardingRollout through the whole live controller, against the fake API server at the HTTP
//! level: the planner turns each label into its node's plan, a scripted agent reports each plan, and
//! the rollout's writes are checked as the API server receives them — the status through the status
//! subresource under `switchyard-controller`, the Node label alone under `switchyard-rollout`, both
//! forced server-side applies — and its Events.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use http::Method;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use switchyard_controller::{
    Config,
    live::run::{Options, run},
    planner::Snapshot,
};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind, Recorded, eventually};
use switchyard_test_support::synthetic::{self, Shape};
use tokio::sync::oneshot;

const ROLLOUTS: &str = "/apis/switchyard.io/v1alpha2/forwardingrollouts";

/// What an agent that can run every backend reports for the plan it was given, verified now.
fn report(plan: &Value) -> Value {
    let revision = plan["spec"]["revision"].clone();
    let backend = plan["spec"]["backend"].clone();
    let now = format!("{:.0}", Timestamp::now());
    json!({
        "observedRevision": revision,
        "backend": backend,
        "conditions": [
            {"type": "Applied", "status": "True", "reason": "Synced", "message": ""},
            {"type": "Degraded", "status": "False", "reason": "Healthy", "message": ""},
        ],
        "verification": {
            "backend": backend, "revision": revision, "at": now,
            "kernel": {"frontends": 2, "mismatches": 0},
            "probes": {"sampled": 1, "failed": 0},
        },
    })
}

/// Every plan whose agent has not reported its revision yet gets its report.
fn agents(server: &FakeApiServer) {
    for key in server.keys(Kind::Plan) {
        let Some(mut plan) = server.get(Kind::Plan, &key) else {
            continue;
        };
        if plan["status"]["observedRevision"] == plan["spec"]["revision"] {
            continue;
        }
        plan["status"] = report(&plan);
        server.put(Kind::Plan, plan);
    }
}

fn rollout_status(server: &FakeApiServer) -> Value {
    server
        .get(Kind::Rollout, "to-nft")
        .map(|r| r["status"].clone())
        .unwrap_or_default()
}

fn writes(server: &FakeApiServer, prefix: &str) -> Vec<Recorded> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::PATCH && r.path.starts_with(prefix))
        .collect()
}

#[tokio::test]
async fn a_rollout_moves_each_node_with_one_label_write_and_says_each_step() {
    let server = FakeApiServer::new();
    let shape = Shape {
        nodes: 2,
        services: 3,
        endpoints: 2,
        zones: 1,
        etp_local_percent: 0,
        itp_local_percent: 0,
        hinted_percent: 0,
    };
    let snapshot = Snapshot::from(synthetic::cluster(&shape).into_parts());
    server.seed(&snapshot.nodes, &snapshot.services, &snapshot.slices);
    server.put(
        Kind::Rollout,
        json!({
            "apiVersion": "switchyard.io/v1alpha2",
            "kind": "ForwardingRollout",
            "metadata": {"name": "to-nft", "uid": "uid-to-nft", "generation": 1,
                         "creationTimestamp": "2026-12-07T10:00:00Z"},
            "spec": {"target": {"backend": "nftables"}, "bakeSeconds": 1},
        }),
    );
    let config = Config {
        min_plan_interval: Duration::from_millis(100),
        ..Config::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let client = server.client();
    let controller = tokio::spawn(async move {
        run(
            client,
            Options::new(config),
            async {
                let _ = stopped.await;
            },
            None,
        )
        .await
        .unwrap();
    });
    let complete = eventually(Duration::from_secs(40), || {
        agents(&server);
        rollout_status(&server)["phase"] == "Complete"
    })
    .await;
    let status = rollout_status(&server);
    assert!(complete, "{status:#}");
    assert_eq!(status["progress"], "2/2");

    // The status: its subresource, our field manager, forced, nothing but the status.
    let status_writes = writes(&server, ROLLOUTS);
    assert!(!status_writes.is_empty());
    for write in &status_writes {
        assert_eq!(write.path, format!("{ROLLOUTS}/to-nft/status"));
        assert!(
            write.query.contains("fieldManager=switchyard-controller") && write.query.contains("force=true"),
            "{}",
            write.query
        );
        let body = write.body.as_ref().unwrap();
        let fields: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["apiVersion", "kind", "metadata", "status"]);
        assert_eq!(body["metadata"], json!({"name": "to-nft"}));
    }
    // The labels: one write per node, the one label, under the rollouts' own field manager.
    let label_writes = writes(&server, "/api/v1/nodes/");
    let nodes: Vec<&str> = label_writes
        .iter()
        .map(|w| w.path.trim_start_matches("/api/v1/nodes/"))
        .collect();
    assert_eq!(nodes, ["node-0000", "node-0001"], "one at a time, in order");
    for write in &label_writes {
        assert!(
            write.query.contains("fieldManager=switchyard-rollout") && write.query.contains("force=true"),
            "{}",
            write.query
        );
        let node = write.path.trim_start_matches("/api/v1/nodes/");
        assert_eq!(
            write.body.as_ref().unwrap(),
            &json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": {"switchyard.io/backend": "nftables"}}})
        );
    }
    for node in ["node-0000", "node-0001"] {
        let plan = server.get(Kind::Plan, node).unwrap();
        assert_eq!(
            plan["spec"]["backend"], "nftables",
            "{node}: the planner followed the label"
        );
    }

    // Each step is an Event on the rollout: Normal for steps.
    let ok = eventually(Duration::from_secs(10), || {
        server.keys(Kind::Event).iter().any(|key| {
            server
                .get(Kind::Event, key)
                .is_some_and(|e| e["reason"] == "Complete")
        })
    })
    .await;
    let events: Vec<Value> = server
        .keys(Kind::Event)
        .iter()
        .filter_map(|key| server.get(Kind::Event, key))
        .collect();
    assert!(ok, "{events:#?}");
    let switching: Vec<&Value> = events.iter().filter(|e| e["reason"] == "NodeSwitching").collect();
    assert_eq!(switching.len(), 2, "{events:#?}");
    for event in &switching {
        assert_eq!(event["type"], "Normal");
        assert_eq!(event["related"]["kind"], "Node");
        assert_eq!(event["action"], "Rollout");
        assert_eq!(event["regarding"]["kind"], "ForwardingRollout");
        assert_eq!(event["regarding"]["name"], "to-nft");
    }
    for node in ["node-0000", "node-0001"] {
        let event = switching
            .iter()
            .find(|e| e["related"]["name"] == node)
            .unwrap_or_else(|| panic!("no NodeSwitching Event related to {node}: {switching:#?}"));
        assert!(
            event["note"]
                .as_str()
                .unwrap()
                .contains(&format!("node {node} switching")),
            "{event:#}"
        );
    }

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .unwrap()
        .unwrap();
}
