#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Cost-control policy: exact rows-scanned numbers for the documented cost model, the cost of
//! every action kind, the per-action limit, the per-rollout and per-run budgets (own ledger and
//! caller-side accounting), configuration validation, and a snapshot of verdicts.

use std::collections::{BTreeMap, HashMap};

use agl_gov::{
    Action, Context, CostConfig, CostControlPolicy, Effect, Finding, GovError, GovernanceMode,
    Kernel, Policy, Severity, Subject, TableStats, Verdict, parse_sql,
};
use proptest::prelude::*;
use serde::Serialize;

fn stats() -> TableStats {
    let tables: HashMap<String, u64> = [
        ("singer", 100),
        ("concert", 10),
        ("singer_in_concert", 50),
        ("stadium", 5),
        ("gold", 7),
        ("t", 1000),
    ]
    .into_iter()
    .map(|(t, n)| (t.to_string(), n))
    .collect();
    let mut s = TableStats::new();
    s.insert("concert_singer".to_string(), tables);
    s
}

fn policy(config: CostConfig) -> CostControlPolicy {
    CostControlPolicy::new(config, stats())
}

fn rows(sql: &str) -> f64 {
    policy(CostConfig::default())
        .estimate("concert_singer", sql)
        .unwrap()
        .rows_scanned
}

#[test]
fn exact_rows_for_the_documented_model() {
    let cases: &[(&str, f64)] = &[
        ("SELECT * FROM singer", 100.0),
        ("SELECT 1", 0.0),
        ("SELECT * FROM no_such_table", 0.0),
        // JOIN with ON / USING adds
        (
            "SELECT * FROM singer AS s JOIN singer_in_concert AS sc ON s.singer_id = sc.singer_id",
            150.0,
        ),
        (
            "SELECT * FROM singer LEFT JOIN singer_in_concert USING (singer_id)",
            150.0,
        ),
        // comma join and CROSS JOIN multiply
        ("SELECT * FROM singer, concert", 1000.0),
        ("SELECT * FROM singer CROSS JOIN concert", 1000.0),
        ("SELECT * FROM singer JOIN concert", 1000.0),
        // mixed: (singer + singer_in_concert) x concert
        (
            "SELECT * FROM singer JOIN singer_in_concert ON 1 = 1, concert",
            1500.0,
        ),
        // derived table contributes its estimate
        ("SELECT * FROM (SELECT * FROM singer) AS x", 100.0),
        ("SELECT * FROM (SELECT * FROM singer) AS x, concert", 1000.0),
        // CTE referenced twice counts twice
        (
            "WITH s AS (SELECT * FROM singer) SELECT * FROM s JOIN s AS s2 ON s.singer_id = s2.singer_id",
            200.0,
        ),
        // subqueries in WHERE / SELECT / HAVING add once
        (
            "SELECT * FROM singer WHERE singer_id IN (SELECT singer_id FROM singer_in_concert)",
            150.0,
        ),
        (
            "SELECT name, (SELECT count(*) FROM concert) FROM singer",
            110.0,
        ),
        (
            "SELECT country FROM singer GROUP BY country HAVING count(*) > (SELECT count(*) FROM stadium)",
            105.0,
        ),
        (
            "SELECT * FROM stadium WHERE EXISTS (SELECT 1 FROM concert WHERE concert.stadium_id = stadium.stadium_id)",
            15.0,
        ),
        // set operations add both sides
        (
            "SELECT name FROM singer UNION SELECT name FROM stadium",
            105.0,
        ),
        (
            "SELECT name FROM singer INTERSECT SELECT name FROM stadium EXCEPT SELECT name FROM gold",
            112.0,
        ),
        // stacked statements add
        ("SELECT * FROM singer; SELECT * FROM concert", 110.0),
        // UPDATE / DELETE scan their table
        ("DELETE FROM singer WHERE age > 1", 100.0),
        (
            "UPDATE singer SET age = 1 WHERE singer_id IN (SELECT singer_id FROM singer_in_concert)",
            150.0,
        ),
        // INSERT ... SELECT scans its source
        ("INSERT INTO gold SELECT * FROM singer", 100.0),
        // table names are case-insensitive
        ("SELECT * FROM SINGER", 100.0),
    ];
    for (sql, expected) in cases {
        assert_eq!(rows(sql), *expected, "{sql}");
    }
}

#[test]
fn cost_is_rows_per_million_times_price() {
    let p = policy(CostConfig {
        price_per_million_rows_usd: 2.0,
        ..CostConfig::default()
    });
    let est = p.estimate("concert_singer", "SELECT * FROM t").unwrap();
    assert_eq!(est.rows_scanned, 1000.0);
    assert!((est.cost_usd - 0.002).abs() < 1e-12);
}

fn check(p: &CostControlPolicy, a: &Action) -> Vec<Finding> {
    p.check(&Subject::new(a)).unwrap()
}

fn record(p: &CostControlPolicy, a: &Action, executed: bool) {
    p.record_outcome(&Subject::new(a), executed);
}

fn reasons(findings: &[Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.reason.as_str()).collect()
}

#[test]
fn hidden_cartesian_product_in_exists_is_blocked_at_defaults() {
    // A correct ("gold") query wrapped in an always-true but enormous EXISTS.
    let sql =
        "SELECT * FROM (SELECT name FROM gold) WHERE EXISTS (SELECT 1 FROM t AS a, t AS b, t AS c)";
    let p = policy(CostConfig::default());
    let est = p.estimate("concert_singer", sql).unwrap();
    assert_eq!(est.rows_scanned, 1e9 + 7.0);
    assert!((est.cost_usd - 10.00000007).abs() < 1e-9, "{est:?}");
    let v = check(&p, &Action::sql("concert_singer", sql));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].severity, Severity::High);
    assert_eq!(v[0].effect, Effect::Block);
    assert_eq!(
        v[0].reason,
        "estimated cost $10.00 (1000000007 rows scanned) exceeds the per-action limit $1.00"
    );

    let k = Kernel::new(GovernanceMode::Enforce).with_policy(policy(CostConfig::default()));
    let d = k.check(&Action::sql("concert_singer", sql)).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.violations[0].policy, "cost_control");
}

#[test]
fn cheap_query_has_no_finding() {
    let p = policy(CostConfig::default());
    assert!(check(&p, &Action::sql("concert_singer", "SELECT * FROM singer")).is_empty());
}

#[test]
fn estimate_statements_prices_already_parsed_sql_and_check_uses_the_action_dialect() {
    let p = policy(CostConfig::default());
    let parsed = parse_sql("SELECT * FROM singer, concert", agl_gov::SqlDialect::Sqlite);
    let est = p
        .estimate_statements("concert_singer", parsed.statements().unwrap())
        .unwrap();
    assert_eq!(est.rows_scanned, 1000.0);
    assert!(matches!(
        p.estimate_statements("nope", parsed.statements().unwrap()),
        Err(GovError::UnknownDatabase { .. })
    ));
    // Backtick quoting parses as MySQL; the check prices the kernel's parse of it.
    let p = policy(CostConfig {
        price_per_million_rows_usd: 1e6,
        ..CostConfig::default()
    });
    let a =
        Action::sql("concert_singer", "SELECT * FROM `t`").with_dialect(agl_gov::SqlDialect::Mysql);
    assert_eq!(p.cost_of(&Subject::new(&a)), Some(1000.0));
    assert_eq!(check(&p, &a).len(), 1);
}

#[test]
fn run_budget_is_exhausted_after_n_executed_actions() {
    // Each action scans 100 rows = $0.0001 at $1 per million rows; budget allows 3.
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        run_budget_usd: Some(0.00035),
        ..CostConfig::default()
    };
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(policy(config));
    let a = Action::sql("concert_singer", "SELECT * FROM singer");
    for i in 0..3 {
        let d = k.check(&a).unwrap();
        assert_eq!(d.verdict, Verdict::Allow, "action {i}: {:?}", d.violations);
    }
    for _ in 0..2 {
        let d = k.check(&a).unwrap();
        assert_eq!(d.verdict, Verdict::Block);
        assert_eq!(d.violations.len(), 1);
        assert_eq!(d.violations[0].severity, Severity::High);
        assert_eq!(
            d.violations[0].reason,
            "run budget exhausted: spent $0.0003 + estimated cost $0.0001 (100 rows scanned) \
             exceeds the run budget $0.00035"
        );
    }
}

#[test]
fn budget_usd_is_still_accepted_and_unknown_fields_are_rejected() {
    let c: CostConfig = serde_json::from_str(r#"{"budget_usd": 0.5}"#).unwrap();
    assert_eq!(c.run_budget_usd, Some(0.5));
    let c: CostConfig = serde_json::from_str(
        r#"{"run_budget_usd": 2, "rollout_budget_usd": 0.1, "usd_per_million_tokens": 3,
            "tool_costs_usd": {"search": 0.01}}"#,
    )
    .unwrap();
    assert_eq!(c.run_budget_usd, Some(2.0));
    assert_eq!(c.rollout_budget_usd, Some(0.1));
    assert_eq!(c.usd_per_million_tokens, 3.0);
    assert_eq!(c.tool_costs_usd["search"], 0.01);
    assert_eq!(c.max_cost_usd, 1.0, "unset fields keep their defaults");
    let err = serde_json::from_str::<CostConfig>(r#"{"budget": 1}"#).unwrap_err();
    assert!(err.to_string().contains("budget"), "{err}");
}

#[test]
fn only_executed_actions_are_charged_to_run_and_rollout() {
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        run_budget_usd: Some(1_000.0),
        ..CostConfig::default()
    };
    let p = policy(config);
    let a = Action::sql("concert_singer", "SELECT * FROM singer").with_rollout_id("r1");
    record(&p, &a, false);
    assert_eq!(p.spent_usd(), 0.0);
    assert_eq!(p.rollout_spent_usd("r1"), 0.0);
    record(&p, &a, true);
    record(&p, &a, true);
    record(&p, &Action::spend(0.5, 0), true);
    assert!((p.spent_usd() - 0.5002).abs() < 1e-12);
    assert!((p.rollout_spent_usd("r1") - 0.0002).abs() < 1e-12);
    assert_eq!(p.rollout_spent_usd("r2"), 0.0);
    p.forget_rollout("r1");
    assert_eq!(p.rollout_spent_usd("r1"), 0.0);
    assert!((p.spent_usd() - 0.5002).abs() < 1e-12, "run total is kept");
}

#[test]
fn without_a_budget_nothing_is_charged() {
    let p = policy(CostConfig {
        price_per_million_rows_usd: 1.0,
        ..CostConfig::default()
    });
    let a = Action::sql("concert_singer", "SELECT * FROM singer").with_rollout_id("r1");
    record(&p, &a, true);
    record(&p, &Action::spend(0.5, 0), true);
    assert_eq!(p.spent_usd(), 0.0);
    assert_eq!(p.rollout_spent_usd("r1"), 0.0);
    assert!(
        p.is_pure(&a.kind),
        "no budget: the findings depend on the action alone"
    );
    let budgeted = policy(CostConfig {
        rollout_budget_usd: Some(1.0),
        ..CostConfig::default()
    });
    assert!(!budgeted.is_pure(&a.kind));
}

#[test]
fn audit_mode_charges_over_budget_actions_because_they_execute() {
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        run_budget_usd: Some(0.00015),
        ..CostConfig::default()
    };
    let k = Kernel::new(GovernanceMode::Audit).with_policy(policy(config));
    let a = Action::sql("concert_singer", "SELECT * FROM singer");
    let verdicts: Vec<Verdict> = (0..3).map(|_| k.check(&a).unwrap().verdict).collect();
    assert_eq!(verdicts, vec![Verdict::Allow, Verdict::Warn, Verdict::Warn]);
}

#[test]
fn unknown_database_is_an_estimate_error_but_no_finding_and_no_charge() {
    let p = policy(CostConfig {
        run_budget_usd: Some(0.0),
        ..CostConfig::default()
    });
    let err = p.estimate("nope", "SELECT 1").unwrap_err();
    assert!(matches!(err, GovError::UnknownDatabase { ref database } if database == "nope"));
    let a = Action::sql("nope", "SELECT * FROM singer");
    assert!(check(&p, &a).is_empty());
    assert_eq!(p.cost_of(&Subject::new(&a)), None);
    record(&p, &a, true);
    assert_eq!(p.spent_usd(), 0.0);
}

#[test]
fn unparsable_sql_is_left_to_sql_safety() {
    let p = policy(CostConfig::default());
    assert!(matches!(
        p.estimate("concert_singer", "SELEC * FROM singer"),
        Err(GovError::SqlParse { .. })
    ));
    assert!(check(&p, &Action::sql("concert_singer", "SELEC * FROM singer")).is_empty());
}

#[test]
fn spend_costs_usd_plus_priced_tokens() {
    let free_tokens = policy(CostConfig::default());
    let a = Action::spend(0.25, 2_000_000);
    assert_eq!(free_tokens.cost_of(&Subject::new(&a)), Some(0.25));
    let priced = policy(CostConfig {
        usd_per_million_tokens: 0.5,
        ..CostConfig::default()
    });
    assert_eq!(priced.cost_of(&Subject::new(&a)), Some(1.25));
    let v = check(&priced, &a);
    assert_eq!(
        reasons(&v),
        vec!["cost $1.25 (spend of $0.25 and 2000000 tokens) exceeds the per-action limit $1.00"]
    );
    assert_eq!(
        (v[0].severity, v[0].effect),
        (Severity::High, Effect::Block)
    );
}

#[test]
fn negative_or_non_finite_spend_is_blocked_and_never_credited() {
    let p = policy(CostConfig {
        run_budget_usd: Some(1.0),
        ..CostConfig::default()
    });
    record(&p, &Action::spend(0.75, 0), true);
    for usd in [-5.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let a = Action::spend(usd, 0);
        let v = check(&p, &a);
        assert_eq!(v.len(), 1, "{usd}: {v:?}");
        assert_eq!(
            (v[0].severity, v[0].effect),
            (Severity::High, Effect::Block)
        );
        assert!(v[0].reason.contains("not a valid cost"), "{}", v[0].reason);
        assert_eq!(p.cost_of(&Subject::new(&a)), None);
        record(&p, &a, true);
        assert_eq!(p.spent_usd(), 0.75, "a {usd} spend changed the ledger");
    }
    // and the budget still blocks a spend that crosses it
    assert_eq!(check(&p, &Action::spend(0.5, 0)).len(), 1);
}

#[test]
fn tool_calls_cost_their_configured_price_and_other_tools_are_free() {
    let mut tool_costs_usd = BTreeMap::new();
    tool_costs_usd.insert("web_search".to_string(), 0.4);
    let p = policy(CostConfig {
        tool_costs_usd,
        run_budget_usd: Some(1.0),
        ..CostConfig::default()
    });
    let search = Action::tool_call("web_search", serde_json::json!({"q": "x"}));
    let other = Action::tool_call("calculator", serde_json::json!({}));
    assert_eq!(p.cost_of(&Subject::new(&search)), Some(0.4));
    assert_eq!(p.cost_of(&Subject::new(&other)), Some(0.0));
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    assert_eq!(k.check(&search).unwrap().verdict, Verdict::Allow); // 0.4
    assert_eq!(k.check(&search).unwrap().verdict, Verdict::Allow); // 0.8
    let d = k.check(&search).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(
        d.violations[0].reason,
        "run budget exhausted: spent $0.80 + cost $0.40 of the tool call exceeds the run budget $1.00"
    );
    assert_eq!(k.check(&other).unwrap().verdict, Verdict::Allow);
}

#[test]
fn output_is_free_and_zero_cost_actions_never_exceed_a_budget() {
    let p = policy(CostConfig {
        run_budget_usd: Some(0.1),
        rollout_budget_usd: Some(0.1),
        ..CostConfig::default()
    });
    record(&p, &Action::spend(0.5, 0).with_rollout_id("r"), true);
    let out = Action::output("the answer is 42").with_rollout_id("r");
    assert_eq!(p.cost_of(&Subject::new(&out)), Some(0.0));
    assert!(check(&p, &out).is_empty());
    // but a priced action is blocked by both budgets
    let v = check(&p, &Action::spend(0.01, 0).with_rollout_id("r"));
    assert_eq!(
        reasons(&v),
        vec![
            "rollout budget exhausted: rollout `r` spent $0.50 + cost $0.01 (spend of $0.01 and 0 tokens) exceeds the rollout budget $0.10",
            "run budget exhausted: spent $0.50 + cost $0.01 (spend of $0.01 and 0 tokens) exceeds the run budget $0.10",
        ]
    );
}

#[test]
fn rollout_budget_is_per_rollout_and_actions_without_rollout_only_count_for_the_run() {
    let config = CostConfig {
        rollout_budget_usd: Some(0.25),
        ..CostConfig::default()
    };
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(policy(config));
    let spend = |r: &str| Action::spend(0.1, 0).with_rollout_id(r);
    let verdicts: Vec<Verdict> = (0..3)
        .map(|_| k.check(&spend("r1")).unwrap().verdict)
        .collect();
    assert_eq!(
        verdicts,
        vec![Verdict::Allow, Verdict::Allow, Verdict::Block]
    );
    let d = k.check(&spend("r1")).unwrap();
    assert!(
        d.violations[0]
            .reason
            .starts_with("rollout budget exhausted: rollout `r1` spent $0.20"),
        "{}",
        d.violations[0].reason
    );
    assert_eq!(k.check(&spend("r2")).unwrap().verdict, Verdict::Allow);
    // no rollout id: no rollout budget applies
    for _ in 0..5 {
        assert_eq!(
            k.check(&Action::spend(0.1, 0)).unwrap().verdict,
            Verdict::Allow
        );
    }
}

#[test]
fn caller_side_spend_in_the_context_replaces_the_ledger() {
    let p = policy(CostConfig {
        rollout_budget_usd: Some(1.0),
        run_budget_usd: Some(10.0),
        ..CostConfig::default()
    });
    let with = |rollout: Option<f64>, run: Option<f64>| {
        Action::spend(0.2, 0).with_context(Context {
            rollout_spend_usd: rollout,
            run_spend_usd: run,
            ..Context::default()
        })
    };
    // empty ledger, but the caller says this rollout already spent 0.9
    let v = check(&p, &with(Some(0.9), None));
    assert_eq!(v.len(), 1);
    assert!(
        v[0].reason
            .starts_with("rollout budget exhausted: this rollout spent $0.90")
    );
    let v = check(&p, &with(None, Some(9.9)));
    assert_eq!(v.len(), 1);
    assert!(v[0].reason.starts_with("run budget exhausted: spent $9.90"));
    // the ledger is over budget, but the caller says nothing was spent
    record(&p, &Action::spend(20.0, 0).with_rollout_id("r"), true);
    let a = Action::spend(0.2, 0).with_context(Context {
        rollout_id: Some("r".into()),
        rollout_spend_usd: Some(0.0),
        run_spend_usd: Some(0.0),
        ..Context::default()
    });
    assert!(check(&p, &a).is_empty());
    let a = Action::spend(0.2, 0).with_rollout_id("r");
    assert_eq!(check(&p, &a).len(), 2);
}

#[test]
fn invalid_configurations_are_rejected_naming_the_field() {
    let cases: Vec<(CostConfig, &str)> = vec![
        (
            CostConfig {
                price_per_million_rows_usd: -0.01,
                ..CostConfig::default()
            },
            "price_per_million_rows_usd",
        ),
        (
            CostConfig {
                max_cost_usd: -1.0,
                ..CostConfig::default()
            },
            "max_cost_usd",
        ),
        (
            CostConfig {
                rollout_budget_usd: Some(-0.5),
                ..CostConfig::default()
            },
            "rollout_budget_usd",
        ),
        (
            CostConfig {
                run_budget_usd: Some(f64::NAN),
                ..CostConfig::default()
            },
            "run_budget_usd",
        ),
        (
            CostConfig {
                usd_per_million_tokens: f64::INFINITY,
                ..CostConfig::default()
            },
            "usd_per_million_tokens",
        ),
        (
            CostConfig {
                tool_costs_usd: [("web_search".to_string(), -1.0)].into_iter().collect(),
                ..CostConfig::default()
            },
            "tool_costs_usd.web_search",
        ),
    ];
    for (config, field) in cases {
        let err = CostControlPolicy::try_new(config.clone(), stats()).unwrap_err();
        match &err {
            GovError::InvalidConfig {
                policy, field: f, ..
            } => {
                assert_eq!(policy, "cost_control");
                assert_eq!(f, field);
            }
            other => panic!("{field}: {other:?}"),
        }
        assert!(config.validate().is_err());
    }
    assert!(CostControlPolicy::try_new(CostConfig::default(), stats()).is_ok());
}

#[derive(Serialize)]
struct Row {
    name: &'static str,
    action: serde_json::Value,
    verdict: Verdict,
    findings: Vec<String>,
}

/// (case name, action). Each row runs on a fresh kernel whose policy has
/// price $1 per million rows, per-action limit $0.5, rollout budget $1, run budget $2,
/// tokens at $2 per million and `web_search` at $0.3 per call; the ledger starts empty, and
/// caller-side spend in the context stands for what was spent before.
fn snapshot_cases() -> Vec<(&'static str, Action)> {
    let ctx = |rollout: Option<f64>, run: Option<f64>| Context {
        rollout_id: Some("r-1".into()),
        rollout_spend_usd: rollout,
        run_spend_usd: run,
        ..Context::default()
    };
    let sql = |s: &str| Action::sql("concert_singer", s);
    let tool = |n: &str| Action::tool_call(n, serde_json::json!({"q": "singers"}));
    vec![
        ("sql_select_small", sql("SELECT * FROM singer")),
        ("sql_select_nothing", sql("SELECT 1")),
        (
            "sql_join_on",
            sql("SELECT * FROM singer JOIN concert ON 1 = 1"),
        ),
        ("sql_cross_t_t", sql("SELECT * FROM t AS a, t AS b")),
        (
            "sql_cross_3_tables",
            sql("SELECT * FROM t AS a, t AS b, singer"),
        ),
        ("sql_unknown_table", sql("SELECT * FROM no_such_table")),
        (
            "sql_unknown_database",
            Action::sql("other_db", "SELECT * FROM t, t, t"),
        ),
        ("sql_unparsable", sql("SELEC * FROM t, t, t")),
        ("sql_empty", sql("")),
        ("sql_stacked", sql("SELECT * FROM t; SELECT * FROM t")),
        ("sql_delete", sql("DELETE FROM t")),
        (
            "sql_near_rollout_budget",
            sql("SELECT * FROM t").with_context(ctx(Some(0.9995), None)),
        ),
        (
            "sql_reaches_rollout_budget_exactly",
            sql("SELECT * FROM t AS a, singer").with_context(ctx(Some(0.9), None)),
        ),
        (
            "sql_crosses_run_budget",
            sql("SELECT * FROM t AS a, singer").with_context(ctx(None, Some(1.95))),
        ),
        ("spend_small", Action::spend(0.1, 0)),
        ("spend_tokens_only", Action::spend(0.0, 100_000)),
        ("spend_tokens_over_limit", Action::spend(0.0, 300_000)),
        ("spend_at_limit", Action::spend(0.5, 0)),
        ("spend_over_limit", Action::spend(0.51, 0)),
        ("spend_zero", Action::spend(0.0, 0)),
        ("spend_negative", Action::spend(-1.0, 0)),
        ("spend_nan", Action::spend(f64::NAN, 0)),
        ("spend_infinite", Action::spend(f64::INFINITY, 0)),
        (
            "spend_crosses_rollout",
            Action::spend(0.2, 0).with_context(ctx(Some(0.9), None)),
        ),
        (
            "spend_crosses_both",
            Action::spend(0.2, 0).with_context(ctx(Some(0.9), Some(1.9))),
        ),
        (
            "spend_over_everything",
            Action::spend(5.0, 0).with_context(ctx(Some(0.9), Some(1.9))),
        ),
        ("tool_priced", tool("web_search")),
        ("tool_free", tool("calculator")),
        (
            "tool_priced_crosses_run",
            tool("web_search").with_context(ctx(None, Some(1.8))),
        ),
        (
            "output_free_even_over_budget",
            Action::output("done").with_context(ctx(Some(5.0), Some(5.0))),
        ),
    ]
}

#[test]
fn snapshot_of_verdicts() {
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        max_cost_usd: 0.5,
        rollout_budget_usd: Some(1.0),
        run_budget_usd: Some(2.0),
        usd_per_million_tokens: 2.0,
        tool_costs_usd: [("web_search".to_string(), 0.3)].into_iter().collect(),
    };
    let rows: Vec<Row> = snapshot_cases()
        .into_iter()
        .map(|(name, action)| {
            let k = Kernel::new(GovernanceMode::Enforce).with_policy(policy(config.clone()));
            let d = k.check(&action).unwrap();
            let mut json = serde_json::to_value(&action.kind).unwrap();
            if let ActionJson::Spend(usd) = ActionJson::of(&action) {
                // NaN / infinity have no JSON form; show them as strings.
                json["usd"] = serde_json::Value::String(usd);
            }
            Row {
                name,
                action: serde_json::json!({"kind": json, "context": action.context}),
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
    insta::assert_json_snapshot!("cost_verdicts", rows);
}

enum ActionJson {
    Spend(String),
    Other,
}

impl ActionJson {
    fn of(a: &Action) -> Self {
        match &a.kind {
            agl_gov::ActionKind::Spend { usd, .. } => ActionJson::Spend(usd.to_string()),
            _ => ActionJson::Other,
        }
    }
}

proptest! {
    #[test]
    fn arbitrary_actions_never_panic(
        sql in ".{0,200}",
        db in prop::sample::select(vec!["concert_singer", "nope"]),
        usd in prop::num::f64::ANY,
        tokens in any::<u64>(),
        name in ".{0,20}",
        rollout in prop::option::of(".{0,8}"),
        spend in prop::option::of(prop::num::f64::ANY),
    ) {
        let mut tool_costs_usd = BTreeMap::new();
        tool_costs_usd.insert(name.clone(), 0.1);
        let p = policy(CostConfig {
            rollout_budget_usd: Some(1.0),
            run_budget_usd: Some(2.0),
            usd_per_million_tokens: 1.0,
            tool_costs_usd,
            ..CostConfig::default()
        });
        let ctx = Context {
            rollout_id: rollout,
            rollout_spend_usd: spend,
            run_spend_usd: spend,
            ..Context::default()
        };
        for a in [
            Action::sql(db, sql.clone()),
            Action::spend(usd, tokens),
            Action::tool_call(name.clone(), serde_json::Value::Null),
            Action::output(sql.clone()),
        ] {
            let a = a.with_context(ctx.clone());
            let _ = check(&p, &a);
            record(&p, &a, true);
            prop_assert!(p.spent_usd() >= 0.0);
        }
    }
}
