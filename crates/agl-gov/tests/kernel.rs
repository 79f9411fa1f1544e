#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Kernel with both built-in policies: enforce vs audit verdicts for the same actions, and
//! property tests that checking never panics, whatever the input.

use std::collections::HashMap;

use agl_gov::{
    Action, CostConfig, CostControlPolicy, FlightRecorder, GovernanceMode, Kernel, Severity,
    SqlPolicy, TableStats, Verdict,
};
use proptest::prelude::*;

fn stats() -> TableStats {
    let tables: HashMap<String, u64> = [("singer", 100u64), ("t", 1000)]
        .into_iter()
        .map(|(t, n)| (t.to_string(), n))
        .collect();
    HashMap::from([("concert_singer".to_string(), tables)])
}

fn kernel(mode: GovernanceMode) -> Kernel {
    Kernel::new(mode)
        .with_policy(SqlPolicy::default())
        .with_policy(CostControlPolicy::new(CostConfig::default(), stats()))
        .with_recorder(FlightRecorder::in_memory())
}

#[test]
fn policy_names_in_order() {
    let k = kernel(GovernanceMode::Enforce);
    assert_eq!(k.policy_names(), vec!["sql_safety", "cost_control"]);
    assert_eq!(k.mode(), GovernanceMode::Enforce);
}

/// (database, sql, enforce verdict, audit verdict, max severity, violated policies)
type Case = (
    &'static str,
    &'static str,
    Verdict,
    Verdict,
    Option<Severity>,
    &'static [&'static str],
);

#[test]
fn enforce_and_audit_verdicts_for_the_same_actions() {
    let cases: &[Case] = &[
        (
            "concert_singer",
            "SELECT name FROM singer",
            Verdict::Allow,
            Verdict::Allow,
            None,
            &[],
        ),
        (
            "concert_singer",
            "DROP TABLE singer",
            Verdict::Block,
            Verdict::Warn,
            Some(Severity::Critical),
            &["sql_safety"],
        ),
        (
            "concert_singer",
            "SELECT 1 FROM t AS a, t AS b, t AS c",
            Verdict::Block,
            Verdict::Warn,
            Some(Severity::High),
            &["cost_control"],
        ),
        (
            "concert_singer",
            "SELECT 1 FROM t AS a, t AS b, t AS c; DELETE FROM singer",
            Verdict::Block,
            Verdict::Warn,
            Some(Severity::Critical),
            &["sql_safety", "cost_control"],
        ),
        (
            "concert_singer",
            "not sql",
            Verdict::Block,
            Verdict::Warn,
            Some(Severity::Medium),
            &["sql_safety"],
        ),
        // No table statistics for the database: the cost policy cannot price it and says
        // nothing (safety is sql_safety's job).
        (
            "unknown_db",
            "SELECT 1",
            Verdict::Allow,
            Verdict::Allow,
            None,
            &[],
        ),
    ];
    let enforce = kernel(GovernanceMode::Enforce);
    let audit = kernel(GovernanceMode::Audit);
    for (db, sql, ev, av, sev, policies) in cases {
        let a = Action::sql(*db, *sql);
        let e = enforce.check(&a).unwrap();
        let au = audit.check(&a).unwrap();
        assert_eq!(e.verdict, *ev, "enforce {sql}: {:?}", e.violations);
        assert_eq!(au.verdict, *av, "audit {sql}");
        assert_eq!(e.executes(), *ev != Verdict::Block);
        assert!(au.executes());
        assert_eq!(e.max_severity(), *sev);
        assert_eq!(e.policies(), policies.to_vec());
        // audit keeps the findings, blocked flags included
        assert_eq!(au.violations, e.violations);
        assert_eq!(e.mode, GovernanceMode::Enforce);
        assert_eq!(au.mode, GovernanceMode::Audit);
    }
    // one recorder entry per check
    assert_eq!(enforce.recorder().unwrap().lines().len(), cases.len());
    assert!(agl_gov::verify_lines(enforce.recorder().unwrap().lines()).is_ok());
}

#[test]
fn decision_json_round_trips() {
    let d = kernel(GovernanceMode::Enforce)
        .check(&Action::sql("concert_singer", "DELETE FROM singer"))
        .unwrap();
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["verdict"], "block");
    assert_eq!(json["violations"][0]["severity"], "critical");
    assert_eq!(json["violations"][0]["effect"], "block");
    let back: agl_gov::Decision = serde_json::from_value(json).unwrap();
    assert_eq!(back, d);
}

#[test]
fn deeply_nested_input_is_rejected_without_overflowing_the_stack() {
    let k = kernel(GovernanceMode::Enforce);
    for depth in [100usize, 10_000] {
        let sql = format!("SELECT {}1{}", "(".repeat(depth), ")".repeat(depth));
        let d = k.check(&Action::sql("concert_singer", sql)).unwrap();
        assert_eq!(d.verdict, Verdict::Block);
        assert_eq!(d.max_severity(), Some(Severity::Medium));
        let sub = format!(
            "SELECT * FROM {}singer{}",
            "(SELECT * FROM ".repeat(depth),
            ")".repeat(depth)
        );
        let d = k.check(&Action::sql("concert_singer", sub)).unwrap();
        assert_eq!(d.verdict, Verdict::Block);
    }
}

fn sqlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("SELECT"),
        Just("FROM"),
        Just("WHERE"),
        Just("JOIN"),
        Just("ON"),
        Just("WITH"),
        Just("AS"),
        Just("UNION"),
        Just("EXISTS"),
        Just("IN"),
        Just("DELETE"),
        Just("DROP"),
        Just("TABLE"),
        Just("UPDATE"),
        Just("SET"),
        Just("INSERT"),
        Just("INTO"),
        Just("VALUES"),
        Just("PRAGMA"),
        Just("ATTACH"),
        Just("singer"),
        Just("t"),
        Just("*"),
        Just(","),
        Just("("),
        Just(")"),
        Just(";"),
        Just("="),
        Just("1"),
        Just("'x'"),
        Just("--"),
        Just("/*"),
        Just("*/"),
        Just("\n"),
    ];
    proptest::collection::vec(token, 0..40).prop_map(|t| t.join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn check_never_panics_on_arbitrary_strings(sql in any::<String>(), db in "[a-z_]{0,12}") {
        for mode in [GovernanceMode::Enforce, GovernanceMode::Audit] {
            let d = kernel(mode).check(&Action::sql(db.clone(), sql.clone())).unwrap();
            prop_assert!(mode == GovernanceMode::Enforce || d.executes());
        }
    }

    #[test]
    fn check_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let sql = String::from_utf8_lossy(&bytes).into_owned();
        let d = kernel(GovernanceMode::Enforce)
            .check(&Action::sql("concert_singer", sql))
            .unwrap();
        // Every built-in finding asks for a block (fail closed), whatever the bytes were.
        prop_assert!(d.violations.iter().all(|v| v.blocked()));
    }

    #[test]
    fn check_never_panics_on_sql_like_token_soup(sql in sqlish()) {
        let k = kernel(GovernanceMode::Enforce);
        let d = k.check(&Action::sql("concert_singer", sql)).unwrap();
        // Every finding of the built-in policies is a blocking one, so enforce blocks iff any.
        prop_assert_eq!(d.verdict == Verdict::Block, d.is_violation());
    }
}

#[test]
fn reset_forgets_budgets_call_counts_and_rate_windows() {
    use agl_gov::{ToolPolicy, ToolPolicyConfig};
    let config: ToolPolicyConfig = serde_json::from_value(serde_json::json!({
        "max_calls_per_rollout": 1
    }))
    .unwrap();
    let kernel = Kernel::new(GovernanceMode::Enforce).with_policy(ToolPolicy::new(config).unwrap());
    let call = || Action::tool_call("search", serde_json::json!({})).with_rollout_id("r1");
    assert_eq!(kernel.check(&call()).unwrap().verdict, Verdict::Allow);
    assert_eq!(kernel.check(&call()).unwrap().verdict, Verdict::Block);
    kernel.reset();
    assert_eq!(kernel.check(&call()).unwrap().verdict, Verdict::Allow);
}

/// Set in the child process of [`a_parser_panic_is_a_silent_parse_failure`]: `parser` checks
/// the reproducer, `outside` panics outside the parser.
const PANIC_CHILD: &str = "AGL_GOV_TEST_PANIC_CHILD";

/// Text that makes sqlparser 0.59 panic in `parse_infix` (SQLite dialect) instead of
/// returning an error.
const PANICKING_SQL: &str = "SELECT * FROM t WHERE a REGEXP";

/// The child's part: the verdict of the panicking text is exactly that of text that does not
/// parse, the panic is counted, and (mode `outside`) a panic elsewhere still reaches the
/// previous hook. Prints `child done` on success.
fn panic_child(mode: &str) {
    let k = kernel(GovernanceMode::Enforce);
    let before = agl_gov::parser_panics();
    let panicked = k
        .check(&Action::sql("concert_singer", PANICKING_SQL))
        .unwrap();
    let unparsable = k
        .check(&Action::sql("concert_singer", "SELECT * FROM t WHERE a ="))
        .unwrap();
    assert_eq!(agl_gov::parser_panics(), before + 1);
    assert_eq!(panicked.verdict, Verdict::Block);
    assert_eq!(panicked.verdict, unparsable.verdict);
    let shape = |d: &agl_gov::Decision| {
        d.violations
            .iter()
            .map(|v| (v.policy.clone(), v.severity, v.effect))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&panicked), shape(&unparsable));
    let reason = &panicked.violations[0].reason;
    assert!(
        reason.contains("SQL does not parse: the SQL parser panicked"),
        "{reason}"
    );
    if mode == "outside" {
        let r = std::panic::catch_unwind(|| panic!("a deliberate panic outside the parser"));
        assert!(r.is_err());
    }
    println!("child done");
}

#[test]
fn a_parser_panic_is_a_silent_parse_failure() {
    if let Ok(mode) = std::env::var(PANIC_CHILD) {
        panic_child(&mode);
        return;
    }
    let run = |mode: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_parser_panic_is_a_silent_parse_failure",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PANIC_CHILD, mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success() && stdout.contains("child done"),
            "child ({mode}) failed:\n{stdout}\n{stderr}"
        );
        stderr
    };
    let stderr = run("parser");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    // The hook hands every other panic to the one it replaced.
    let stderr = run("outside");
    assert!(
        stderr.contains("a deliberate panic outside the parser"),
        "stderr: {stderr}"
    );
    assert_eq!(stderr.matches("panicked").count(), 1, "stderr: {stderr}");
}
