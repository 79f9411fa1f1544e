#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Cost-control policy: exact rows-scanned numbers for the documented cost model, the
//! per-action limit, the per-run budget and the unknown-database fail-closed rule.

use std::collections::HashMap;

use agl_gov::{
    Action, CostConfig, CostControlPolicy, GovError, GovernanceMode, Kernel, Policy, Severity,
    TableStats, Verdict,
};

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

#[test]
fn hidden_cartesian_product_in_exists_is_blocked_at_defaults() {
    // A correct ("gold") query wrapped in an always-true but enormous EXISTS.
    let sql =
        "SELECT * FROM (SELECT name FROM gold) WHERE EXISTS (SELECT 1 FROM t AS a, t AS b, t AS c)";
    let p = policy(CostConfig::default());
    let est = p.estimate("concert_singer", sql).unwrap();
    assert_eq!(est.rows_scanned, 1e9 + 7.0);
    assert!((est.cost_usd - 10.00000007).abs() < 1e-9, "{est:?}");
    let v = p.check(&Action::sql("concert_singer", sql));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].severity, Severity::High);
    assert!(v[0].blocked);
    assert_eq!(v[0].policy, "cost_control");
    assert!(
        v[0].reason
            == "estimated cost $10.00 (1000000007 rows scanned) exceeds the per-action limit $1.00",
        "{}",
        v[0].reason
    );

    let k = Kernel::new(GovernanceMode::Enforce).with_policy(policy(CostConfig::default()));
    assert_eq!(
        k.check(&Action::sql("concert_singer", sql))
            .unwrap()
            .verdict,
        Verdict::Block
    );
}

#[test]
fn cheap_query_has_no_finding() {
    let p = policy(CostConfig::default());
    assert!(
        p.check(&Action::sql("concert_singer", "SELECT * FROM singer"))
            .is_empty()
    );
}

#[test]
fn budget_is_exhausted_after_n_executed_actions() {
    // Each action scans 100 rows = $0.0001 at $1 per million rows; budget allows 3.
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        max_cost_usd: 1.0,
        budget_usd: Some(0.00035),
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
        assert!(d.violations[0].reason.starts_with("run budget exhausted"));
    }
}

#[test]
fn only_executed_actions_are_charged() {
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        ..CostConfig::default()
    };
    let p = policy(config);
    let a = Action::sql("concert_singer", "SELECT * FROM singer");
    p.record_outcome(&a, false);
    assert_eq!(p.spent_usd(), 0.0);
    p.record_outcome(&a, true);
    p.record_outcome(&a, true);
    assert!((p.spent_usd() - 0.0002).abs() < 1e-12);
}

#[test]
fn audit_mode_charges_over_budget_actions_because_they_execute() {
    let config = CostConfig {
        price_per_million_rows_usd: 1.0,
        max_cost_usd: 1.0,
        budget_usd: Some(0.00015),
    };
    let k = Kernel::new(GovernanceMode::Audit).with_policy(policy(config));
    let a = Action::sql("concert_singer", "SELECT * FROM singer");
    let verdicts: Vec<Verdict> = (0..3).map(|_| k.check(&a).unwrap().verdict).collect();
    assert_eq!(verdicts, vec![Verdict::Allow, Verdict::Warn, Verdict::Warn]);
}

#[test]
fn unknown_database_is_an_error_and_a_blocked_medium_finding() {
    let p = policy(CostConfig::default());
    let err = p.estimate("nope", "SELECT 1").unwrap_err();
    assert!(matches!(err, GovError::UnknownDatabase { ref database } if database == "nope"));
    let v = p.check(&Action::sql("nope", "SELECT * FROM singer"));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].severity, Severity::Medium);
    assert!(v[0].blocked);
    assert_eq!(v[0].reason, "no table statistics for database `nope`");
}

#[test]
fn unparsable_sql_is_left_to_sql_safety() {
    let p = policy(CostConfig::default());
    assert!(matches!(
        p.estimate("concert_singer", "SELEC * FROM singer"),
        Err(GovError::SqlParse { .. })
    ));
    assert!(
        p.check(&Action::sql("concert_singer", "SELEC * FROM singer"))
            .is_empty()
    );
}
