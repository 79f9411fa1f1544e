#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
//! temporary
use agl_gov::policies::*;
use agl_gov::*;
use serde_json::json;
use std::time::Instant;
#[test]
fn perf() {
    let tool = ToolPolicy::new(serde_json::from_value(json!({
        "allow": ["send_email", "db_*", "search"], "deny": ["db_drop*"],
        "arguments": {"send_email": {"to": {"regex": "[a-z0-9.]+@example\\.com", "required": true}, "priority": {"one_of": ["low","high"]}}},
        "max_calls_per_rollout": 1000000
    })).unwrap()).unwrap();
    let content = ContentPolicy::new(ContentPolicyConfig::default()).unwrap();
    let rate = RateLimitPolicy::new(RateLimitConfig {
        max_actions: 1_000_000,
        ..Default::default()
    })
    .unwrap();
    let cost = CostControlPolicy::new(
        CostConfig {
            run_budget_usd: Some(1e9),
            rollout_budget_usd: Some(1e9),
            ..Default::default()
        },
        Default::default(),
    );
    let a = Action::tool_call("search", json!({"query": "singers born after 1990", "limit": 10, "body": "Hello Bob, the meeting is at 3pm tomorrow in room 12. Regards."})).with_rollout_id("r1").with_agent_id("g1");
    let pii = Action::tool_call(
        "send_email",
        json!({"to": "bob@example.com", "priority": "low", "body": "card 4111 1111 1111 1111"}),
    )
    .with_rollout_id("r1")
    .with_agent_id("g1");
    let out = Action::output("The singer with the most concerts is Joe Sharp, who performed 3 times in 2014 at Stark's Park.".repeat(3));
    let n = 200_000;
    for (name, p) in [
        ("tool", &tool as &dyn Policy),
        ("content", &content),
        ("rate", &rate),
        ("cost", &cost),
    ] {
        for act in [&a, &pii, &out] {
            let t = Instant::now();
            for _ in 0..n {
                let s = Subject::new(act);
                let f = p.check(&s).unwrap();
                std::hint::black_box(f);
            }
            eprintln!(
                "{name} {} check: {:.0} ns",
                act.kind.type_name(),
                t.elapsed().as_nanos() as f64 / n as f64
            );
        }
    }
    let k = Kernel::new(GovernanceMode::Enforce)
        .with_policy(ToolPolicy::new(tool.config().clone()).unwrap())
        .with_policy(ContentPolicy::new(ContentPolicyConfig::default()).unwrap())
        .with_policy(
            RateLimitPolicy::new(RateLimitConfig {
                max_actions: 1_000_000,
                ..Default::default()
            })
            .unwrap(),
        )
        .with_policy(CostControlPolicy::new(
            CostConfig::default(),
            Default::default(),
        ));
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(k.check(&a).unwrap());
    }
    eprintln!(
        "kernel 4 policies clean tool call: {:.0} ns",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}
