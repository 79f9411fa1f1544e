#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Cedar policy: loading and validation errors, Cedar decision semantics (forbid wins, default
//! deny), annotations, failing closed on evaluation errors, every context field, the example
//! policies in `examples/policies/` (pinned by a verdict-table snapshot), and robustness
//! against arbitrary identifiers.

use std::collections::BTreeSet;
use std::path::PathBuf;

use agl_gov::policies::cedar::{CEDAR_POLICY_NAME, DEFAULT_DENY_REASON};
use agl_gov::policies::{CedarConfig, CedarPolicy};
use agl_gov::{
    Action, Context, Effect, Finding, GovError, GovernanceMode, Kernel, Policy, Severity,
    SqlDialect, Subject, Verdict,
};
use proptest::prelude::*;
use serde_json::json;

const PERMIT_ALL: &str = "permit (principal, action, resource);\n";

fn load(text: &str) -> CedarPolicy {
    CedarPolicy::from_source("test.cedar", text).unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> String {
    match CedarPolicy::from_source("test.cedar", text) {
        Ok(p) => panic!("expected a load error, loaded {p:?}"),
        Err(e) => {
            assert!(matches!(e, GovError::Cedar { .. }), "{e:?}");
            e.to_string()
        }
    }
}

fn check(p: &CedarPolicy, action: &Action) -> Vec<Finding> {
    p.check(&Subject::new(action))
        .unwrap_or_else(|e| panic!("{action:?}: {e}"))
}

fn reasons(findings: &[Finding]) -> BTreeSet<String> {
    findings.iter().map(|f| f.reason.clone()).collect()
}

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/policies")
}

fn example_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cedar"))
        .collect();
    files.sort();
    files
}

fn example(name: &str) -> CedarPolicy {
    CedarPolicy::from_files(&[examples_dir().join(name)]).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// Load errors

#[test]
fn a_syntax_error_names_the_origin_and_its_line_and_column() {
    let err =
        load_err("permit (principal, action, resource);\n\nforbid (principal action, resource);\n");
    assert!(err.contains("test.cedar"), "{err}");
    assert!(err.contains("syntax error"), "{err}");
    assert!(err.contains("line 3, column"), "{err}");
}

#[test]
fn a_schema_validation_error_names_the_policy_and_the_attribute() {
    let err = load_err(&format!(
        "{PERMIT_ALL}forbid (principal, action == Agl::Action::\"sql\", resource)\n  when {{ context.row_count > 10 }};\n"
    ));
    assert!(err.contains("test.cedar"), "{err}");
    assert!(err.contains("schema validation failed"), "{err}");
    assert!(err.contains("`test.cedar:1`"), "{err}");
    assert!(err.contains("row_count"), "{err}");
    assert!(err.contains("line 3, column 10"), "{err}");

    // a field of another action's context is an error too (strict validation per action)
    let err = load_err(
        "@id(\"wrong_action\")\nforbid (principal, action == Agl::Action::\"tool_call\", resource)\n  when { context.sql == \"x\" };\n",
    );
    assert!(err.contains("wrong_action") && err.contains("sql"), "{err}");

    // an unknown entity type
    let err = load_err("forbid (principal == Agl::User::\"bob\", action, resource);\n");
    assert!(err.contains("Agl::User"), "{err}");
}

#[test]
fn invalid_annotations_duplicates_templates_and_empty_sets_are_load_errors() {
    let cases = [
        (
            "@penalty(\"lots\")\nforbid (principal, action, resource);",
            "@penalty(\"lots\")",
        ),
        (
            "@penalty(\"-5\")\nforbid (principal, action, resource);",
            "non-negative",
        ),
        (
            "@penalty(\"NaN\")\nforbid (principal, action, resource);",
            "finite",
        ),
        (
            "@severity(\"extreme\")\nforbid (principal, action, resource);",
            "extreme",
        ),
        (
            "@effect(\"modify\")\nforbid (principal, action, resource);",
            "modify",
        ),
        ("@id(\"\")\nforbid (principal, action, resource);", "@id"),
        (
            "@id(\"x\")\nforbid (principal, action, resource);\n@id(\"x\")\npermit (principal, action, resource);",
            "duplicate policy id `x`",
        ),
        (
            "permit (principal == ?principal, action, resource);",
            "templates",
        ),
        ("// nothing but a comment\n", "no Cedar policies"),
    ];
    for (text, wanted) in cases {
        let err = load_err(text);
        assert!(err.contains("test.cedar"), "{text}: {err}");
        assert!(err.contains(wanted), "{text}: {err}");
    }
    // the annotation error names the policy id
    let err =
        load_err("@id(\"p1\")\n@severity(\"extreme\")\nforbid (principal, action, resource);");
    assert!(err.contains("policy `p1`"), "{err}");
}

#[test]
fn files_are_named_in_errors_and_ids_must_be_unique_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.cedar");
    let err = CedarPolicy::from_files(std::slice::from_ref(&missing))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing.cedar") && err.contains("cannot read"),
        "{err}"
    );

    let a = dir.path().join("a.cedar");
    let b = dir.path().join("b.cedar");
    std::fs::write(&a, "@id(\"same\")\npermit (principal, action, resource);\n").unwrap();
    std::fs::write(&b, "@id(\"same\")\nforbid (principal, action, resource);\n").unwrap();
    let err = CedarPolicy::from_files(&[a.clone(), b.clone()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("b.cedar") && err.contains("duplicate policy id `same`"),
        "{err}"
    );
    assert!(err.contains("a.cedar"), "{err}");

    // without @id, default ids are <file>:<index> and never collide across files
    std::fs::write(
        &b,
        "permit (principal, action, resource);\nforbid (principal, action, resource);\n",
    )
    .unwrap();
    std::fs::write(&a, "permit (principal, action, resource);\n").unwrap();
    let p = CedarPolicy::from_files(&[a.clone(), b.clone()]).unwrap();
    let ids = p.policy_ids();
    assert_eq!(
        ids,
        vec![
            format!("{}:0", a.display()),
            format!("{}:0", b.display()),
            format!("{}:1", b.display()),
        ]
    );
    let findings = check(&p, &Action::output("hi"));
    assert_eq!(
        findings[0].reason,
        format!("forbidden by Cedar policy {}:1", b.display())
    );
}

#[test]
fn config_resolves_relative_files_and_adds_inline_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.cedar"), PERMIT_ALL).unwrap();
    let config: CedarConfig = serde_json::from_value(json!({
        "files": ["base.cedar"],
        "source": "@id(\"no_output\") forbid (principal, action == Agl::Action::\"output\", resource);"
    }))
    .unwrap();
    let p = CedarPolicy::from_config(&config, dir.path()).unwrap();
    assert_eq!(p.policy_ids().len(), 2);
    assert!(check(&p, &Action::sql("db", "SELECT 1")).is_empty());
    assert_eq!(
        reasons(&check(&p, &Action::output("x"))),
        BTreeSet::from(["forbidden by Cedar policy no_output".to_string()])
    );
    // unknown keys are rejected; an empty config loads nothing and is an error
    assert!(serde_json::from_value::<CedarConfig>(json!({"file": "x"})).is_err());
    let err = CedarPolicy::from_config(&CedarConfig::default(), dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no Cedar policies"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Decisions and annotations

#[test]
fn forbid_wins_over_permit_and_allow_has_no_findings() {
    let p = load(&format!(
        "{PERMIT_ALL}@id(\"no_drop\")\nforbid (principal, action == Agl::Action::\"sql\", resource)\n  when {{ context.statement_kinds.contains(\"drop\") }};\n"
    ));
    assert!(check(&p, &Action::sql("db", "SELECT 1")).is_empty());
    let findings = check(&p, &Action::sql("db", "DROP TABLE singer"));
    assert_eq!(findings.len(), 1);
    let f = &findings[0];
    assert_eq!(
        (f.severity, f.effect, f.penalty, f.reason.as_str()),
        (
            Severity::High,
            Effect::Block,
            None,
            "forbidden by Cedar policy no_drop"
        )
    );
}

#[test]
fn action_scopes_with_eq_in_lists_and_any_apply_to_exactly_their_actions() {
    let p = load(&format!(
        r#"{PERMIT_ALL}
@id("listed") forbid (principal, action in [Agl::Action::"sql", Agl::Action::"output"], resource);
@id("spend_only") forbid (principal, action == Agl::Action::"spend", resource);
@id("any_anonymous") forbid (principal == Agl::Agent::"anonymous", action, resource);
"#
    ));
    let ids = |a: Action| {
        check(&p, &a.with_agent_id("a"))
            .into_iter()
            .map(|f| f.reason.rsplit(' ').next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(Action::sql("db", "SELECT 1")), vec!["listed"]);
    assert_eq!(ids(Action::output("x")), vec!["listed"]);
    assert_eq!(ids(Action::spend(0.0, 0)), vec!["spend_only"]);
    assert!(ids(Action::tool_call("t", json!({}))).is_empty());
    let findings = check(&p, &Action::tool_call("t", json!({})));
    assert_eq!(reasons(&findings).len(), 1, "{findings:?}");
    assert!(findings[0].reason.ends_with("any_anonymous"));
}

#[test]
fn nothing_applicable_is_a_default_deny() {
    let p = load("permit (principal, action == Agl::Action::\"sql\", resource);");
    assert!(check(&p, &Action::sql("db", "SELECT 1")).is_empty());
    let findings = check(&p, &Action::tool_call("search", json!({})));
    assert_eq!(
        findings,
        vec![Finding::block(Severity::High, DEFAULT_DENY_REASON)]
    );
}

#[test]
fn annotations_set_severity_penalty_effect_and_reason_in_load_order() {
    let p = load(&format!(
        r#"{PERMIT_ALL}
@id("b_warn")
@effect("warn")
@severity("low")
@penalty("2.5")
forbid (principal, action == Agl::Action::"tool_call", resource == Agl::Tool::"http_get");

@id("a_block")
@severity("critical")
@penalty("100")
@reason("no network at all")
forbid (principal, action == Agl::Action::"tool_call", resource);
"#
    ));
    let findings = check(&p, &Action::tool_call("http_get", json!({"url": "x"})));
    let got: Vec<(Severity, Effect, Option<f64>, &str)> = findings
        .iter()
        .map(|f| (f.severity, f.effect, f.penalty, f.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Severity::Low,
                Effect::Warn,
                Some(2.5),
                "forbidden by Cedar policy b_warn"
            ),
            (
                Severity::Critical,
                Effect::Block,
                Some(100.0),
                "no network at all"
            ),
        ]
    );

    // a warn-only forbid lets the action through, recorded, in a kernel
    let p = load(&format!(
        "{PERMIT_ALL}@effect(\"warn\") @severity(\"medium\")\nforbid (principal, action == Agl::Action::\"output\", resource);"
    ));
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let d = k.check(&Action::output("hello")).unwrap();
    assert_eq!(d.verdict, Verdict::Warn);
    assert_eq!(d.violations[0].policy, CEDAR_POLICY_NAME);
    assert_eq!(d.violations[0].severity, Severity::Medium);
}

#[test]
fn an_evaluation_error_is_an_error_and_the_kernel_fails_closed() {
    // Long overflow: Cedar skips an erroring policy, which for a forbid would fail open.
    let p = load(&format!(
        "{PERMIT_ALL}@id(\"overflowing\")\nforbid (principal, action == Agl::Action::\"spend\", resource)\n  when {{ context.usd_micros * 9223372036854775807 > 0 }};\n"
    ));
    let action = Action::spend(1.0, 0);
    match p.check(&Subject::new(&action)) {
        Err(GovError::Cedar { origin, message }) => {
            assert_eq!(origin, "test.cedar");
            assert!(message.contains("overflowing"), "{message}");
            assert!(message.contains("failing closed"), "{message}");
        }
        other => panic!("expected a Cedar error, got {other:?}"),
    }
    // a zero amount does not overflow: no error, no finding
    assert!(check(&p, &Action::spend(0.0, 0)).is_empty());

    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let d = k.check(&action).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert!(
        d.violations[0].reason.contains("failing closed"),
        "{:?}",
        d.violations
    );
}

#[test]
fn amounts_cedar_cannot_represent_fail_closed() {
    let p = load(PERMIT_ALL);
    for action in [
        Action::spend(f64::NAN, 0),
        Action::spend(-1.0, 0),
        Action::output("x").with_context(Context {
            run_spend_usd: Some(f64::INFINITY),
            ..Context::default()
        }),
    ] {
        let err = p.check(&Subject::new(&action)).unwrap_err().to_string();
        assert!(
            err.contains("not a finite, non-negative USD amount"),
            "{err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Every context field

/// One forbid per expected (field, value); each reason is the field name, so the set of
/// reasons shows which fields had exactly the expected value.
fn field_policies(action: &str, checks: &[(&str, &str)]) -> CedarPolicy {
    let mut text = String::from(PERMIT_ALL);
    for (name, condition) in checks {
        text.push_str(&format!(
            "@id(\"{name}\") @reason(\"{name}\")\nforbid (principal, action == Agl::Action::\"{action}\", resource) when {{ {condition} }};\n"
        ));
    }
    load(&text)
}

fn assert_all_fields(action: &str, checks: &[(&str, &str)], subject: &Action) {
    let p = field_policies(action, checks);
    let got = reasons(&check(&p, subject));
    let want: BTreeSet<String> = checks.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(got, want, "{subject:?}");
}

fn full_context() -> Context {
    Context {
        agent_id: Some("agent-1".into()),
        rollout_id: Some("ro-1".into()),
        attempt_id: Some("at-1".into()),
        step: Some(3),
        rollout_spend_usd: Some(0.02),
        run_spend_usd: Some(1.5),
    }
}

const COMMON_SET: &[(&str, &str)] = &[
    ("principal", "principal == Agl::Agent::\"agent-1\""),
    ("rollout_id", "context.rollout_id == \"ro-1\""),
    ("step", "context.step == 3"),
    (
        "rollout_spend_micros",
        "context.rollout_spend_micros == 20000",
    ),
    ("run_spend_micros", "context.run_spend_micros == 1500000"),
];

const COMMON_UNSET: &[(&str, &str)] = &[
    ("principal", "principal == Agl::Agent::\"anonymous\""),
    ("rollout_id", "context.rollout_id == \"\""),
    ("step", "context.step == -1"),
    ("rollout_spend_micros", "context.rollout_spend_micros == -1"),
    ("run_spend_micros", "context.run_spend_micros == -1"),
];

fn with(
    common: &[(&'static str, &'static str)],
    extra: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    common.iter().chain(extra).copied().collect()
}

#[test]
fn sql_context_fields_are_set() {
    let sql = "SELECT name FROM main.Singer WHERE id IN (SELECT id FROM concert); SELECT 1";
    let checks = with(
        COMMON_SET,
        &[
            ("resource", "resource == Agl::Database::\"concert_singer\""),
            (
                "sql",
                "context.sql == \"SELECT name FROM main.Singer WHERE id IN (SELECT id FROM concert); SELECT 1\"",
            ),
            ("dialect", "context.dialect == \"postgres\""),
            ("statement_kinds", "context.statement_kinds == [\"select\"]"),
            (
                "tables",
                "context.tables == [\"main.singer\", \"singer\", \"concert\"]",
            ),
            ("statement_count", "context.statement_count == 2"),
            ("parse_error", "context.parse_error == false"),
        ],
    );
    let action = Action::sql("concert_singer", sql)
        .with_dialect(SqlDialect::Postgres)
        .with_context(full_context());
    assert_all_fields("sql", &checks, &action);

    let checks = with(
        COMMON_UNSET,
        &[
            ("statement_kinds", "context.statement_kinds.isEmpty()"),
            ("tables", "context.tables.isEmpty()"),
            ("statement_count", "context.statement_count == 0"),
            ("parse_error", "context.parse_error"),
            ("dialect", "context.dialect == \"sqlite\""),
            (
                "kinds_of_drop",
                "!context.statement_kinds.contains(\"drop\")",
            ),
        ],
    );
    assert_all_fields("sql", &checks, &Action::sql("db", "DROP TABLE x WHERE"));

    let checks = [
        (
            "kinds",
            "context.statement_kinds == [\"select\", \"delete\", \"drop\"]",
        ),
        ("tables", "context.tables == [\"singer\", \"credentials\"]"),
    ];
    assert_all_fields(
        "sql",
        &checks,
        &Action::sql(
            "db",
            "SELECT 1; DeLeTe FROM singer; DROP TABLE \"Credentials\"",
        ),
    );
}

#[test]
fn tool_output_and_spend_context_fields_are_set() {
    let checks = with(
        COMMON_SET,
        &[
            ("resource", "resource == Agl::Tool::\"send email\""),
            (
                "arguments_json",
                r#"context.arguments_json == "{\"a\":[1,2],\"b\":\"x\\\"y\"}""#,
            ),
            ("argument_names", "context.argument_names == [\"a\", \"b\"]"),
        ],
    );
    let action = Action::tool_call("send email", json!({"b": "x\"y", "a": [1, 2]}))
        .with_context(full_context());
    assert_all_fields("tool_call", &checks, &action);
    let checks = with(
        COMMON_UNSET,
        &[
            ("arguments_json", "context.arguments_json == \"[1]\""),
            ("argument_names", "context.argument_names.isEmpty()"),
        ],
    );
    assert_all_fields("tool_call", &checks, &Action::tool_call("t", json!([1])));

    let checks = with(
        COMMON_SET,
        &[
            ("resource", "resource == Agl::Channel::\"output\""),
            ("text", "context.text == \"héllo wörld\""),
            ("length", "context.length == 11"),
        ],
    );
    assert_all_fields(
        "output",
        &checks,
        &Action::output("héllo wörld").with_context(full_context()),
    );

    let checks = with(
        COMMON_SET,
        &[
            ("resource", "resource == Agl::Budget::\"run\""),
            ("usd_micros", "context.usd_micros == 250001"),
            ("tokens", "context.tokens == 1000"),
        ],
    );
    assert_all_fields(
        "spend",
        &checks,
        &Action::spend(0.250_000_6, 1000).with_context(full_context()),
    );
    let checks = [("tokens", "context.tokens == 9223372036854775807")];
    assert_all_fields("spend", &checks, &Action::spend(0.0, u64::MAX));
}

// ---------------------------------------------------------------------------------------------
// Kernel and the example policies

#[test]
fn in_a_kernel_a_drop_is_blocked_with_the_annotated_severity() {
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(example("sql_readonly.cedar"));
    let d = k
        .check(&Action::sql("concert_singer", "DROP TABLE singer"))
        .unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert!(!d.executes());
    assert_eq!(d.violations.len(), 1);
    let v = &d.violations[0];
    assert_eq!(
        (v.policy.as_str(), v.severity, v.penalty, v.effect),
        (
            CEDAR_POLICY_NAME,
            Severity::Critical,
            Some(100.0),
            Effect::Block
        )
    );
    assert_eq!(
        v.reason,
        "only SELECT statements are allowed (read-only SQL)"
    );
    let d = k
        .check(&Action::sql("concert_singer", "SELECT name FROM singer"))
        .unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    // audit mode records the same finding but lets the action run
    let k = k.with_mode(GovernanceMode::Audit);
    let d = k
        .check(&Action::sql("concert_singer", "DROP TABLE singer"))
        .unwrap();
    assert_eq!(
        (d.verdict, d.violations[0].severity),
        (Verdict::Warn, Severity::Critical)
    );
}

#[test]
fn every_example_file_loads_alone_and_together() {
    let files = example_files();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for wanted in [
        "sql_readonly.cedar",
        "tools.cedar",
        "email.cedar",
        "output.cedar",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} missing from {names:?}"
        );
    }
    for file in &files {
        let p =
            CedarPolicy::from_files(std::slice::from_ref(file)).unwrap_or_else(|e| panic!("{e}"));
        // every example has a permit-all baseline: harmless actions are allowed
        assert!(
            check(&p, &Action::sql("db", "SELECT 1")).is_empty(),
            "{file:?}"
        );
        assert!(check(&p, &Action::output("42")).is_empty(), "{file:?}");
    }
    let all = CedarPolicy::from_files(&files).unwrap();
    assert!(all.policy_ids().len() >= 12, "{:?}", all.policy_ids());
}

fn email(to: serde_json::Value) -> Action {
    Action::tool_call(
        "send_email",
        json!({"to": to, "subject": "hi", "body": "see you, bob"}),
    )
}

/// (label, action) pairs covering each rule of each example file, both sides.
fn example_cases() -> Vec<(&'static str, Action)> {
    let spent = |usd: f64| {
        Action::spend(0.01, 10).with_context(Context {
            rollout_spend_usd: Some(usd),
            ..Context::default()
        })
    };
    vec![
        (
            "sql select",
            Action::sql("concert_singer", "SELECT name FROM singer"),
        ),
        (
            "sql cte",
            Action::sql("db", "WITH x AS (SELECT 1) SELECT * FROM x"),
        ),
        (
            "sql drop in comment",
            Action::sql("db", "SELECT 1 -- DROP TABLE singer"),
        ),
        ("sql drop", Action::sql("db", "DROP TABLE singer")),
        (
            "sql stacked delete",
            Action::sql("db", "SELECT 1; DeLeTe FROM singer"),
        ),
        (
            "sql update in cte",
            Action::sql("db", "WITH x AS (SELECT 1) UPDATE singer SET a = 1")
                .with_dialect(SqlDialect::Postgres),
        ),
        (
            "sql mysql version comment",
            Action::sql("db", "SELECT 1 /*!50000 ; DROP TABLE singer */")
                .with_dialect(SqlDialect::Mysql),
        ),
        ("sql unparsable", Action::sql("db", "SELEC nonsense")),
        (
            "sql credentials",
            Action::sql("db", "SELECT * FROM main.\"Credentials\""),
        ),
        (
            "sql insert from secrets",
            Action::sql("db", "INSERT INTO logs SELECT * FROM secrets"),
        ),
        (
            "sql credentials in subquery",
            Action::sql("db", "SELECT 1 WHERE EXISTS (SELECT 1 FROM api_keys)"),
        ),
        (
            "tool search",
            Action::tool_call("search", json!({"q": "shell"})),
        ),
        (
            "tool shell",
            Action::tool_call("shell", json!({"cmd": "ls"})),
        ),
        (
            "tool http_get",
            Action::tool_call("http_get", json!({"url": "https://example.com"})),
        ),
        ("email company", email(json!("alice@example.com"))),
        (
            "email company, keys reordered",
            Action::tool_call("send_email", json!({"body": "x", "to": "a@example.com"})),
        ),
        ("email external", email(json!("eve@evil.com"))),
        ("email subdomain", email(json!("eve@evil.example.com"))),
        ("email upper-case domain", email(json!("alice@EXAMPLE.COM"))),
        (
            "email two recipients",
            email(json!("eve@evil.com, alice@example.com")),
        ),
        (
            "email two at signs",
            email(json!("eve@evil.com@example.com")),
        ),
        (
            "email display name",
            email(json!("Eve <eve@evil.com> x@example.com")),
        ),
        (
            "email quote injection",
            email(json!("eve@evil.com\", \"x@example.com")),
        ),
        ("email recipient list", email(json!(["alice@example.com"]))),
        (
            "email missing to",
            Action::tool_call("send_email", json!({"subject": "x@example.com"})),
        ),
        (
            "email extra cc",
            Action::tool_call(
                "send_email",
                json!({"to": "a@example.com", "cc": "eve@evil.com"}),
            ),
        ),
        (
            "email to in body",
            Action::tool_call(
                "send_email",
                json!({"body": "\"to\":\"a@example.com\"}", "to": "eve@evil.com"}),
            ),
        ),
        ("output answer", Action::output("The answer is 42")),
        (
            "output private key",
            Action::output("here: -----BEGIN RSA PRIVATE KEY-----\nMIIE..."),
        ),
        ("output 20001 chars", Action::output("é".repeat(20_001))),
        ("spend 0.40 USD", Action::spend(0.4, 1000)),
        ("spend 0.60 USD", Action::spend(0.6, 1000)),
        ("rollout spent 6 USD", spent(6.0)),
        ("rollout spent 4 USD", spent(4.0)),
    ]
}

#[test]
fn example_policies_verdict_table() {
    let k = Kernel::new(GovernanceMode::Enforce)
        .with_policy(CedarPolicy::from_files(&example_files()).unwrap());
    let mut table = String::new();
    for (label, action) in example_cases() {
        let d = k.check(&action).unwrap();
        let findings: Vec<String> = d
            .violations
            .iter()
            .map(|v| {
                let penalty = v.penalty.map_or(String::new(), |p| format!(" penalty {p}"));
                format!("{} {}{}: {}", v.effect, v.severity, penalty, v.reason)
            })
            .collect();
        let line = format!("{label:<30} {:<5} {}", d.verdict, findings.join(" | "));
        table.push_str(line.trim_end());
        table.push('\n');
    }
    insta::assert_snapshot!("example_verdicts", table);
}

#[test]
fn example_policies_decide_the_cases_that_matter() {
    let k = Kernel::new(GovernanceMode::Enforce)
        .with_policy(CedarPolicy::from_files(&example_files()).unwrap());
    let verdict = |label: &str| {
        let (_, action) = example_cases()
            .into_iter()
            .find(|(l, _)| *l == label)
            .unwrap();
        k.check(&action).unwrap().verdict
    };
    for label in [
        "sql select",
        "sql cte",
        "sql drop in comment",
        "tool search",
        "email company",
        "email company, keys reordered",
        "output answer",
        "spend 0.40 USD",
        "rollout spent 4 USD",
    ] {
        assert_eq!(verdict(label), Verdict::Allow, "{label}");
    }
    for label in ["tool http_get", "output 20001 chars"] {
        assert_eq!(verdict(label), Verdict::Warn, "{label}");
    }
    for (label, _) in example_cases() {
        if label.starts_with("email ") && !label.starts_with("email company")
            || label.starts_with("sql ")
                && !["sql select", "sql cte", "sql drop in comment"].contains(&label)
        {
            assert_eq!(verdict(label), Verdict::Block, "{label}");
        }
    }
    for label in [
        "tool shell",
        "output private key",
        "spend 0.60 USD",
        "rollout spent 6 USD",
    ] {
        assert_eq!(verdict(label), Verdict::Block, "{label}");
    }
}

/// Prints the per-check cost (run with `--release --ignored --nocapture`); no assertion on time.
#[test]
#[ignore = "timing report, run manually in release mode"]
fn per_check_micros() {
    let p = CedarPolicy::from_files(&example_files()).unwrap();
    let cases = [
        (
            "sql",
            Action::sql(
                "concert_singer",
                "SELECT name, age FROM singer WHERE age > 30 ORDER BY age LIMIT 5",
            ),
        ),
        (
            "tool_call",
            Action::tool_call(
                "send_email",
                json!({"to": "a@example.com", "subject": "s", "body": "b"}),
            ),
        ),
        ("output", Action::output("The answer is 42")),
        ("spend", Action::spend(0.01, 100)),
    ];
    for (name, action) in cases {
        let n = 20_000;
        // the SQL is parsed once per Subject, as in the kernel; measure parse + Cedar separately
        let subject = Subject::new(&action);
        let _ = subject.sql();
        let start = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(p.check(std::hint::black_box(&subject)).unwrap());
        }
        let cedar = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        let start = std::time::Instant::now();
        for _ in 0..n {
            let subject = Subject::new(std::hint::black_box(&action));
            std::hint::black_box(p.check(&subject).unwrap());
        }
        let with_parse = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        println!("{name:<10} cedar check {cedar:6.2} µs   incl. SQL parse {with_parse:6.2} µs");
    }
}

// ---------------------------------------------------------------------------------------------
// Robustness

static EXAMPLES: std::sync::LazyLock<CedarPolicy> =
    std::sync::LazyLock::new(|| CedarPolicy::from_files(&example_files()).unwrap());

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_identifiers_and_text_never_panic(
        sql in "\\PC*|[\"'\\\\;\\x00-\\x1f]{0,12}|SELECT .{0,20}",
        name in "\\PC*|[\"\\\\\\x00:]{0,8}",
        agent in proptest::option::of("\\PC*|[\"\\x00]{0,4}"),
        database in "\\PC{0,16}",
        text in "\\PC{0,64}",
    ) {
        let p = &*EXAMPLES;
        let context = Context { agent_id: agent.clone(), rollout_id: agent, ..Context::default() };
        for action in [
            Action::sql(database.clone(), sql.clone()),
            Action::sql(database.clone(), sql.clone()).with_dialect(SqlDialect::Mysql),
            Action::tool_call(name.clone(), json!({ name.clone(): text.clone() })),
            Action::tool_call(name.clone(), json!(text.clone())),
            Action::output(text.clone()),
            Action::spend(0.1, 5),
        ] {
            let action = action.with_context(context.clone());
            // never panics, and never errors: every such request is well formed
            let result = p.check(&Subject::new(&action));
            prop_assert!(result.is_ok(), "{:?}: {:?}", action, result);
        }
    }
}
