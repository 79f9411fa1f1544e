#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Tool policy: allow and deny lists with prefix patterns, argument constraints (regex, range,
//! enum, required, wrong types, non-object arguments), per-rollout call limits counted on
//! executed calls only, configuration errors, a snapshot of verdicts and a no-panic property.

use agl_gov::policies::{ArgConstraint, ToolPolicy, ToolPolicyConfig};
use agl_gov::{
    Action, Effect, Finding, GovError, GovernanceMode, Kernel, Policy, Severity, Subject, Verdict,
};
use proptest::prelude::*;
use serde::Serialize;
use serde_json::{Value, json};

fn check(p: &ToolPolicy, a: &Action) -> Vec<Finding> {
    p.check(&Subject::new(a)).unwrap()
}

fn reasons(p: &ToolPolicy, a: &Action) -> Vec<String> {
    check(p, a).into_iter().map(|f| f.reason).collect()
}

fn call(name: &str, args: Value) -> Action {
    Action::tool_call(name, args)
}

fn config_from(yaml_like_json: Value) -> ToolPolicyConfig {
    serde_json::from_value(yaml_like_json).unwrap()
}

/// The configuration of the snapshot and of several tests.
fn email_config() -> ToolPolicyConfig {
    config_from(json!({
        "allow": ["send_email", "db_*", "search", "transfer"],
        "deny": ["db_drop*", "shell"],
        "arguments": {
            "send_email": {
                "to": {"regex": "[a-z0-9.]+@example\\.com", "required": true},
                "priority": {"one_of": ["low", "normal", "high"]},
                "attachments": {"max": 3}
            },
            "transfer": {
                "amount": {"min": 0.01, "max": 100, "required": true},
                "currency": {"one_of": ["USD", "EUR"], "required": true}
            },
            "db_query": {"limit": {"one_of": [10, 100]}}
        }
    }))
}

#[test]
fn non_tool_actions_get_no_finding() {
    let p = ToolPolicy::new(config_from(
        json!({"allow": ["nothing"], "max_calls_per_rollout": 0}),
    ))
    .unwrap();
    for a in [
        Action::sql("db", "DROP TABLE x"),
        Action::output("shell"),
        Action::spend(1.0, 1),
    ] {
        assert!(check(&p, &a).is_empty(), "{a:?}");
    }
}

#[test]
fn empty_lists_allow_every_tool() {
    let p = ToolPolicy::new(ToolPolicyConfig::default()).unwrap();
    assert!(check(&p, &call("anything_at_all", Value::Null)).is_empty());
}

#[test]
fn deny_wins_over_allow_and_prefix_patterns_match_only_prefixes() {
    let p = ToolPolicy::new(config_from(json!({
        "allow": ["db_*"],
        "deny": ["db_drop*"]
    })))
    .unwrap();
    assert!(check(&p, &call("db_query", json!({}))).is_empty());
    let v = check(&p, &call("db_drop_table", json!({})));
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].severity, v[0].effect),
        (Severity::High, Effect::Block)
    );
    assert_eq!(
        v[0].reason,
        "tool `db_drop_table` is denied (deny pattern `db_drop*`)"
    );
    // not a prefix match: `xdb_query` and `DB_query` (case-sensitive) are not allow-listed
    for name in ["xdb_query", "DB_query", "db"] {
        let v = check(&p, &call(name, json!({})));
        assert_eq!(
            v.iter().map(|f| f.reason.as_str()).collect::<Vec<_>>(),
            vec![format!("tool `{name}` is not in the allow list")],
        );
        assert_eq!(v[0].severity, Severity::High);
    }
}

#[test]
fn exact_deny_without_allow_list() {
    let p = ToolPolicy::new(config_from(json!({"deny": ["shell"]}))).unwrap();
    assert_eq!(check(&p, &call("shell", json!({}))).len(), 1);
    assert!(check(&p, &call("shell_escape", json!({}))).is_empty());
}

#[test]
fn regex_constraints_match_the_whole_string() {
    let p = ToolPolicy::new(email_config()).unwrap();
    assert!(check(&p, &call("send_email", json!({"to": "bob@example.com"}))).is_empty());
    assert_eq!(
        reasons(
            &p,
            &call("send_email", json!({"to": "bob@example.com.evil.org"}))
        ),
        vec![
            "tool `send_email`: argument `to` = \"bob@example.com.evil.org\" violates regex `[a-z0-9.]+@example\\.com`"
        ]
    );
    let v = check(&p, &call("send_email", json!({"to": 42})));
    assert_eq!(
        (v[0].severity, v[0].effect),
        (Severity::Medium, Effect::Block)
    );
    assert!(
        v[0].reason.contains("it is a number, expected a string"),
        "{}",
        v[0].reason
    );
}

#[test]
fn required_arguments_must_be_present() {
    let p = ToolPolicy::new(email_config()).unwrap();
    assert_eq!(
        reasons(&p, &call("send_email", json!({"priority": "low"}))),
        vec!["tool `send_email`: required argument `to` is missing"]
    );
    // optional arguments may be absent
    assert!(check(&p, &call("send_email", json!({"to": "a@example.com"}))).is_empty());
}

#[test]
fn numeric_ranges_are_inclusive_and_need_numbers() {
    let p = ToolPolicy::new(email_config()).unwrap();
    let t = |amount: Value| call("transfer", json!({"amount": amount, "currency": "USD"}));
    assert!(check(&p, &t(json!(0.01))).is_empty());
    assert!(check(&p, &t(json!(100))).is_empty());
    assert_eq!(
        reasons(&p, &t(json!(100.5))),
        vec!["tool `transfer`: argument `amount` = 100.5 violates max 100"]
    );
    assert_eq!(
        reasons(&p, &t(json!(-3))),
        vec!["tool `transfer`: argument `amount` = -3 violates min 0.01"]
    );
    assert_eq!(
        reasons(&p, &t(json!("50"))),
        vec![
            "tool `transfer`: argument `amount` = \"50\" violates the numeric range (it is a string, expected a number)"
        ]
    );
}

#[test]
fn one_of_compares_json_values_and_numbers_by_value() {
    let p = ToolPolicy::new(email_config()).unwrap();
    assert!(check(&p, &call("db_query", json!({"limit": 10.0}))).is_empty());
    assert_eq!(
        reasons(&p, &call("db_query", json!({"limit": "10"}))),
        vec!["tool `db_query`: argument `limit` = \"10\" violates one_of [10, 100]"]
    );
    assert_eq!(
        reasons(
            &p,
            &call("transfer", json!({"amount": 1, "currency": "GBP"}))
        ),
        vec!["tool `transfer`: argument `currency` = \"GBP\" violates one_of [\"USD\", \"EUR\"]"]
    );
}

#[test]
fn every_violated_argument_is_reported() {
    let p = ToolPolicy::new(email_config()).unwrap();
    let v = reasons(
        &p,
        &call(
            "send_email",
            json!({"to": "x@evil.org", "priority": "urgent", "attachments": 9}),
        ),
    );
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(
        v.iter()
            .any(|r| r.contains("`attachments` = 9 violates max 3"))
    );
    assert!(v.iter().any(|r| r.contains("`priority` = \"urgent\"")));
    assert!(v.iter().any(|r| r.contains("`to` = \"x@evil.org\"")));
}

#[test]
fn long_values_are_truncated_in_reasons() {
    let p = ToolPolicy::new(email_config()).unwrap();
    let long = "a".repeat(500);
    let v = reasons(&p, &call("send_email", json!({"to": long})));
    assert_eq!(v.len(), 1);
    assert!(v[0].contains(&format!("\"{}…", "a".repeat(79))), "{}", v[0]);
    assert!(!v[0].contains(&"a".repeat(100)));
}

#[test]
fn non_object_arguments_are_a_finding_when_constraints_exist() {
    let p = ToolPolicy::new(email_config()).unwrap();
    for (args, kind) in [
        (json!(["bob@example.com"]), "an array"),
        (json!("bob@example.com"), "a string"),
        (Value::Null, "null"),
    ] {
        assert_eq!(
            reasons(&p, &call("send_email", args)),
            vec![format!(
                "arguments of tool `send_email` are {kind}, expected a JSON object (the tool has argument constraints)"
            )]
        );
    }
    // a tool without constraints may take any arguments
    assert!(check(&p, &call("search", json!("free text"))).is_empty());
}

#[test]
fn call_limit_per_rollout_counts_executed_calls_only() {
    let p = ToolPolicy::new(config_from(json!({"max_calls_per_rollout": 2}))).unwrap();
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let a = call("search", json!({})).with_rollout_id("r1");
    assert_eq!(k.check(&a).unwrap().verdict, Verdict::Allow);
    assert_eq!(k.check(&a).unwrap().verdict, Verdict::Allow);
    let d = k.check(&a).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.violations[0].severity, Severity::Medium);
    assert_eq!(
        d.violations[0].reason,
        "tool call limit reached: rollout `r1` already made 2 tool calls (max 2 per rollout)"
    );
    // blocked calls are not counted, other rollouts have their own count
    assert_eq!(k.check(&a).unwrap().verdict, Verdict::Block);
    let other = call("search", json!({})).with_rollout_id("r2");
    assert_eq!(k.check(&other).unwrap().verdict, Verdict::Allow);
    // SQL actions do not count
    let p = ToolPolicy::new(config_from(json!({"max_calls_per_rollout": 1}))).unwrap();
    p.record_outcome(
        &Subject::new(&Action::sql("db", "SELECT 1").with_rollout_id("r")),
        true,
    );
    let a = call("search", json!({})).with_rollout_id("r");
    assert!(check(&p, &a).is_empty());
    p.record_outcome(&Subject::new(&a), false);
    assert_eq!(p.calls_in_rollout(Some("r")), 0);
    p.record_outcome(&Subject::new(&a), true);
    assert_eq!(p.calls_in_rollout(Some("r")), 1);
    assert_eq!(check(&p, &a).len(), 1);
    p.forget_rollout("r");
    assert!(check(&p, &a).is_empty());
}

#[test]
fn calls_without_rollout_share_one_counter() {
    let p = ToolPolicy::new(config_from(json!({"max_calls_per_rollout": 1}))).unwrap();
    let a = call("search", json!({}));
    p.record_outcome(&Subject::new(&a), true);
    assert_eq!(p.calls_in_rollout(None), 1);
    let v = reasons(&p, &call("other_tool", json!({})));
    assert_eq!(
        v,
        vec![
            "tool call limit reached: calls without a rollout id already made 1 tool calls (max 1 per rollout)"
        ]
    );
}

#[test]
fn per_tool_call_limits_count_only_that_tool() {
    let p = ToolPolicy::new(config_from(json!({
        "max_calls_per_tool_per_rollout": {"send_email": 1}
    })))
    .unwrap();
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let email = call("send_email", json!({})).with_rollout_id("r");
    let search = call("search", json!({})).with_rollout_id("r");
    assert_eq!(k.check(&email).unwrap().verdict, Verdict::Allow);
    for _ in 0..3 {
        assert_eq!(k.check(&search).unwrap().verdict, Verdict::Allow);
    }
    let d = k.check(&email).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(
        d.violations[0].reason,
        "tool call limit reached: rollout `r` already called `send_email` 1 times (max 1 per rollout)"
    );
}

#[test]
fn configuration_errors_name_the_field() {
    let err = |v: Value| match ToolPolicy::new(config_from(v)) {
        Err(GovError::InvalidConfig { policy, field, .. }) => {
            assert_eq!(policy, "tool_policy");
            field
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        err(json!({"arguments": {"t": {"x": {"regex": "(unclosed"}}}})),
        "arguments.t.x.regex"
    );
    assert_eq!(
        err(json!({"arguments": {"t": {"x": {"min": 5, "max": 1}}}})),
        "arguments.t.x.min"
    );
    assert_eq!(err(json!({"deny": ["ok", "a*b"]})), "deny[1]");
    assert_eq!(err(json!({"allow": [""]})), "allow[0]");
    // unknown fields are rejected by serde
    assert!(serde_json::from_value::<ToolPolicyConfig>(json!({"alow": []})).is_err());
    assert!(serde_json::from_value::<ArgConstraint>(json!({"pattern": "x"})).is_err());
}

#[test]
fn kernel_blocks_a_denied_tool_and_names_the_policy() {
    let k =
        Kernel::new(GovernanceMode::Enforce).with_policy(ToolPolicy::new(email_config()).unwrap());
    let d = k.check(&call("shell", json!({"cmd": "rm -rf /"}))).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.policies(), vec!["tool_policy"]);
    let d = k
        .check(&call("send_email", json!({"to": "bob@example.com"})))
        .unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
}

#[derive(Serialize)]
struct Row {
    name: &'static str,
    tool: &'static str,
    arguments: Value,
    verdict: Verdict,
    findings: Vec<String>,
}

#[test]
fn snapshot_of_verdicts() {
    let cases: Vec<(&str, &str, Value)> = vec![
        ("email_ok", "send_email", json!({"to": "bob@example.com"})),
        (
            "email_ok_all_fields",
            "send_email",
            json!({"to": "a.b@example.com", "priority": "high", "attachments": 3}),
        ),
        (
            "email_wrong_domain",
            "send_email",
            json!({"to": "bob@evil.org"}),
        ),
        (
            "email_suffix_attack",
            "send_email",
            json!({"to": "bob@example.com.evil.org"}),
        ),
        (
            "email_uppercase_rejected_by_regex",
            "send_email",
            json!({"to": "Bob@example.com"}),
        ),
        ("email_missing_to", "send_email", json!({"priority": "low"})),
        ("email_null_to", "send_email", json!({"to": null})),
        (
            "email_bad_priority",
            "send_email",
            json!({"to": "bob@example.com", "priority": "urgent"}),
        ),
        (
            "email_too_many_attachments",
            "send_email",
            json!({"to": "bob@example.com", "attachments": 4}),
        ),
        (
            "email_attachments_string",
            "send_email",
            json!({"to": "bob@example.com", "attachments": "2"}),
        ),
        (
            "email_extra_argument_ok",
            "send_email",
            json!({"to": "bob@example.com", "bcc": "x@y.z"}),
        ),
        ("email_args_array", "send_email", json!(["bob@example.com"])),
        ("email_args_null", "send_email", Value::Null),
        (
            "transfer_ok",
            "transfer",
            json!({"amount": 25, "currency": "EUR"}),
        ),
        (
            "transfer_min_edge",
            "transfer",
            json!({"amount": 0.01, "currency": "USD"}),
        ),
        (
            "transfer_below_min",
            "transfer",
            json!({"amount": 0, "currency": "USD"}),
        ),
        (
            "transfer_above_max",
            "transfer",
            json!({"amount": 1e9, "currency": "USD"}),
        ),
        (
            "transfer_negative",
            "transfer",
            json!({"amount": -100, "currency": "USD"}),
        ),
        (
            "transfer_bool_amount",
            "transfer",
            json!({"amount": true, "currency": "USD"}),
        ),
        ("transfer_missing_both", "transfer", json!({})),
        (
            "transfer_bad_currency",
            "transfer",
            json!({"amount": 5, "currency": "usd"}),
        ),
        (
            "db_query_ok",
            "db_query",
            json!({"sql": "SELECT 1", "limit": 100}),
        ),
        (
            "db_query_float_limit_equal",
            "db_query",
            json!({"limit": 10.0}),
        ),
        ("db_query_bad_limit", "db_query", json!({"limit": 1000})),
        ("db_other_prefix_tool", "db_schema", json!({})),
        (
            "db_drop_denied",
            "db_drop_table",
            json!({"table": "singer"}),
        ),
        ("shell_denied", "shell", json!({"cmd": "ls"})),
        ("search_free_args", "search", json!("anything")),
        ("not_allow_listed", "calculator", json!({"x": 1})),
        ("prefix_lookalike", "dbx_query", json!({})),
        ("empty_name", "", json!({})),
    ];
    let rows: Vec<Row> = cases
        .into_iter()
        .map(|(name, tool, arguments)| {
            let k = Kernel::new(GovernanceMode::Enforce)
                .with_policy(ToolPolicy::new(email_config()).unwrap());
            let d = k.check(&call(tool, arguments.clone())).unwrap();
            Row {
                name,
                tool,
                arguments,
                verdict: d.verdict,
                findings: d
                    .violations
                    .iter()
                    .map(|v| format!("{} {}: {}", v.severity, v.effect, v.reason))
                    .collect(),
            }
        })
        .collect();
    assert!(rows.len() >= 30);
    insta::assert_json_snapshot!("tool_verdicts", rows);
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<f64>().prop_map(|f| json!(f)),
        any::<i64>().prop_map(|i| json!(i)),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec!["to", "amount", "currency", "limit", "priority", "x"])
                    .prop_map(str::to_string),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_arguments_never_panic(
        name in prop::sample::select(vec!["send_email", "transfer", "db_query", "db_drop", "shell", "x"]),
        args in arb_json(),
        rollout in prop::option::of("[a-z]{0,3}"),
    ) {
        let mut config = email_config();
        config.max_calls_per_rollout = Some(3);
        config.max_calls_per_tool_per_rollout.insert("transfer".into(), 1);
        let p = ToolPolicy::new(config).unwrap();
        let mut a = call(name, args);
        if let Some(r) = rollout {
            a = a.with_rollout_id(r);
        }
        for _ in 0..5 {
            let v = check(&p, &a);
            for f in &v {
                prop_assert!(f.reason.chars().count() < 400, "{}", f.reason);
            }
            p.record_outcome(&Subject::new(&a), v.is_empty());
        }
    }
}
