#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! SQL safety policy: a fixture table of SQL inputs whose verdicts are pinned by an insta JSON
//! snapshot, plus targeted assertions for the cases that matter most.

use agl_gov::{
    Action, GovernanceMode, Kernel, Severity, SqlPolicy, SqlPolicyConfig, StatementKind, Verdict,
};
use serde::Serialize;

/// (case name, SQL text). At least 40 inputs covering the shapes an agent may produce.
const CASES: &[(&str, &str)] = &[
    ("select_simple", "SELECT name FROM singer"),
    (
        "select_where_order_limit",
        "SELECT name, age FROM singer WHERE age > 30 ORDER BY age DESC LIMIT 5",
    ),
    ("select_count", "SELECT count(*) FROM singer"),
    (
        "select_group_having",
        "SELECT country, count(*) FROM singer GROUP BY country HAVING count(*) > 1",
    ),
    (
        "join_on",
        "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
    ),
    (
        "left_join_using",
        "SELECT name FROM singer LEFT JOIN singer_in_concert USING (singer_id)",
    ),
    (
        "comma_join",
        "SELECT s.name, c.concert_name FROM singer AS s, concert AS c WHERE s.singer_id = c.concert_id",
    ),
    (
        "cte",
        "WITH older AS (SELECT * FROM singer WHERE age > 40) SELECT name FROM older",
    ),
    (
        "recursive_cte",
        "WITH RECURSIVE cnt(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM cnt WHERE x < 5) SELECT x FROM cnt",
    ),
    (
        "nested_in_subqueries",
        "SELECT name FROM singer WHERE singer_id IN (SELECT singer_id FROM singer_in_concert WHERE concert_id IN (SELECT concert_id FROM concert WHERE year = 2014))",
    ),
    (
        "not_exists",
        "SELECT name FROM stadium AS s WHERE NOT EXISTS (SELECT 1 FROM concert AS c WHERE c.stadium_id = s.stadium_id)",
    ),
    (
        "scalar_subquery_in_select",
        "SELECT name, (SELECT max(age) FROM singer) FROM stadium",
    ),
    (
        "derived_table",
        "SELECT avg(n) FROM (SELECT count(*) AS n FROM concert GROUP BY year)",
    ),
    (
        "union",
        "SELECT name FROM singer UNION SELECT name FROM stadium",
    ),
    (
        "intersect",
        "SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer WHERE age < 30",
    ),
    (
        "except",
        "SELECT stadium_id FROM stadium EXCEPT SELECT stadium_id FROM concert",
    ),
    ("values", "VALUES (1, 'a'), (2, 'b')"),
    ("trailing_semicolon", "SELECT 1;"),
    ("stacked_select_delete", "SELECT 1; DELETE FROM t"),
    ("stacked_two_selects", "SELECT 1; SELECT 2"),
    (
        "stacked_lowercase_drop",
        "select * from singer where name = 'x'; drop table singer",
    ),
    (
        "stacked_drop_then_comment",
        "SELECT 1; DROP TABLE singer; --",
    ),
    ("drop_table", "DROP TABLE singer"),
    ("drop_table_if_exists", "DROP TABLE IF EXISTS singer"),
    ("drop_view", "DROP VIEW singer_view"),
    ("drop_index", "DROP INDEX idx_singer_age"),
    (
        "drop_after_line_comment",
        "-- just a harmless query\nDROP TABLE singer",
    ),
    ("drop_after_block_comment", "/* SELECT */ DROP TABLE singer"),
    ("delete_mixed_case", "DeLeTe FrOm singer"),
    ("delete_with_where", "DELETE FROM singer WHERE age > 100"),
    ("update_without_where", "UPDATE singer SET age = 0"),
    (
        "update_with_where",
        "UPDATE singer SET age = 0 WHERE singer_id = 1",
    ),
    (
        "insert_values",
        "INSERT INTO singer (singer_id, name) VALUES (99, 'x')",
    ),
    ("insert_select", "INSERT INTO archive SELECT * FROM singer"),
    ("replace_into", "REPLACE INTO singer (singer_id) VALUES (1)"),
    (
        "create_table",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)",
    ),
    (
        "create_table_as",
        "CREATE TABLE copy AS SELECT * FROM singer",
    ),
    ("create_index", "CREATE INDEX idx ON singer (age)"),
    ("create_view", "CREATE VIEW v AS SELECT name FROM singer"),
    (
        "alter_add_column",
        "ALTER TABLE singer ADD COLUMN x INTEGER",
    ),
    ("alter_rename", "ALTER TABLE singer RENAME TO performer"),
    ("attach_database", "ATTACH DATABASE '/tmp/evil.db' AS evil"),
    ("detach_database", "DETACH DATABASE evil"),
    ("pragma_call", "PRAGMA table_info(singer)"),
    ("pragma_set", "PRAGMA journal_mode = OFF"),
    ("pragma_quoted_arg", "PRAGMA table_info('singer')"),
    ("pragma_bare", "PRAGMA user_version"),
    ("truncate", "TRUNCATE TABLE singer"),
    ("vacuum", "VACUUM"),
    ("begin_transaction", "BEGIN TRANSACTION"),
    (
        "explain_query_plan",
        "EXPLAIN QUERY PLAN SELECT * FROM singer",
    ),
    (
        "cte_hiding_delete",
        "WITH d AS (DELETE FROM singer RETURNING *) SELECT * FROM d",
    ),
    ("garbage", "this is not sql at all"),
    ("unterminated_string", "SELECT 'abc FROM singer"),
    ("empty", ""),
    ("whitespace_only", "   \n\t  "),
    ("semicolon_only", ";"),
    ("double_semicolon", "SELECT 1;;"),
    ("comment_after_statement", "SELECT 1; -- DROP TABLE singer"),
    ("comment_only", "-- DROP TABLE singer"),
    (
        "string_literal_with_drop",
        "SELECT 'DROP TABLE singer' AS x FROM singer",
    ),
    (
        "line_comment_with_delete",
        "SELECT name FROM singer -- DELETE FROM singer",
    ),
    (
        "block_comment_with_delete",
        "SELECT /* DELETE FROM singer */ name FROM singer",
    ),
    (
        "identifier_named_drop",
        "SELECT \"drop\", \"delete\" FROM singer",
    ),
];

#[derive(Serialize)]
struct Row {
    name: &'static str,
    sql: &'static str,
    verdict: Verdict,
    max_severity: Option<Severity>,
    findings: Vec<String>,
}

fn kernel() -> Kernel {
    Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::default())
}

fn check(sql: &str) -> agl_gov::Decision {
    kernel().check(&Action::sql("concert_singer", sql)).unwrap()
}

#[test]
fn fixture_table_has_enough_distinct_cases() {
    assert!(CASES.len() >= 40);
    let mut names: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), CASES.len(), "case names must be unique");
}

#[test]
fn fixture_verdicts_snapshot() {
    let k = kernel();
    let rows: Vec<Row> = CASES
        .iter()
        .map(|&(name, sql)| {
            let d = k.check(&Action::sql("concert_singer", sql)).unwrap();
            Row {
                name,
                sql,
                verdict: d.verdict,
                max_severity: d.max_severity(),
                findings: d
                    .violations
                    .iter()
                    .map(|v| format!("{}: {}", v.severity, v.reason))
                    .collect(),
            }
        })
        .collect();
    insta::assert_json_snapshot!("sql_fixture_verdicts", rows);
}

#[test]
fn queries_of_every_shape_are_allowed() {
    for (name, sql) in CASES.iter().take(18) {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Allow, "{name}: {:?}", d.violations);
    }
}

#[test]
fn literals_comments_and_quoted_identifiers_are_not_flagged() {
    for sql in [
        "SELECT 'DROP TABLE singer' AS x FROM singer",
        "SELECT name FROM singer -- DELETE FROM singer",
        "SELECT /* DELETE FROM singer */ name FROM singer",
        "SELECT \"drop\" FROM singer",
    ] {
        assert_eq!(check(sql).verdict, Verdict::Allow, "{sql}");
    }
}

#[test]
fn destructive_statements_are_critical_and_blocked() {
    for sql in [
        "DROP TABLE singer",
        "-- harmless\nDROP TABLE singer",
        "DeLeTe FrOm singer",
        "UPDATE singer SET age = 0",
        "ATTACH DATABASE 'x.db' AS x",
    ] {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        assert_eq!(d.max_severity(), Some(Severity::Critical), "{sql}");
        assert!(
            d.violations
                .iter()
                .all(|v| v.blocked && v.policy == "sql_safety")
        );
    }
}

#[test]
fn where_clause_lowers_delete_and_update_to_high() {
    for sql in [
        "DELETE FROM singer WHERE age > 100",
        "UPDATE singer SET age = 0 WHERE singer_id = 1",
    ] {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Block);
        assert_eq!(d.max_severity(), Some(Severity::High), "{sql}");
    }
    let d = check("DELETE FROM singer");
    assert!(
        d.violations[0]
            .reason
            .contains("DELETE without WHERE on table `singer`"),
        "{}",
        d.violations[0].reason
    );
}

#[test]
fn stacked_statements_get_one_extra_high_finding() {
    let d = check("SELECT 1; DELETE FROM t");
    let reasons: Vec<&str> = d.violations.iter().map(|v| v.reason.as_str()).collect();
    assert_eq!(d.violations.len(), 2, "{reasons:?}");
    assert_eq!(d.violations[0].severity, Severity::Critical);
    assert_eq!(d.violations[1].severity, Severity::High);
    assert!(reasons[1].contains("stacked statements (2)"), "{reasons:?}");

    let relaxed =
        Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::new(SqlPolicyConfig {
            max_statements: 2,
            ..SqlPolicyConfig::default()
        }));
    let d = relaxed
        .check(&Action::sql("db", "SELECT 1; SELECT 2"))
        .unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
}

#[test]
fn unparsable_and_empty_input_fail_closed_at_medium() {
    for sql in [
        "this is not sql at all",
        "SELECT 'abc FROM singer",
        "",
        "  ",
        ";",
    ] {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql:?}");
        assert_eq!(d.max_severity(), Some(Severity::Medium), "{sql:?}");
        assert_eq!(d.violations.len(), 1, "{sql:?}");
    }
    let d = check("SELEC name FROM singer");
    assert!(d.violations[0].reason.contains("does not parse"));
    assert!(
        d.violations[0].reason.contains("SELEC"),
        "{}",
        d.violations[0].reason
    );
}

#[test]
fn classify_walks_nested_statements() {
    assert_eq!(
        SqlPolicy::classify("SELECT 1; DROP TABLE x").unwrap(),
        vec![StatementKind::Select, StatementKind::Drop]
    );
    assert_eq!(
        SqlPolicy::classify("INSERT INTO a SELECT * FROM b").unwrap(),
        vec![StatementKind::Insert]
    );
}

#[test]
fn audit_mode_keeps_findings_but_lets_everything_execute() {
    let audit = Kernel::new(GovernanceMode::Audit).with_policy(SqlPolicy::default());
    for (name, sql) in CASES {
        let enforced = check(sql);
        let audited = audit.check(&Action::sql("concert_singer", *sql)).unwrap();
        assert!(audited.executes(), "{name}");
        assert_eq!(audited.violations, enforced.violations, "{name}");
        let expected = if enforced.is_violation() {
            Verdict::Warn
        } else {
            Verdict::Allow
        };
        assert_eq!(audited.verdict, expected, "{name}");
    }
}
