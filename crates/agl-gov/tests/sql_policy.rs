#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! SQL safety policy: a fixture table of ~100 SQL inputs whose verdicts under the default
//! policy and under a read-only + `max_rows = 100` policy are pinned by an insta JSON snapshot
//! (D11's bypass table, the agentmesh facet cases, false-positive rows, Spider queries), plus
//! targeted tests of every configuration field, each dialect's comment rules, the LIMIT
//! rewrite's exact SQL, and the reasons users read.

use agl_gov::policies::sql::NameLists;
use agl_gov::{
    Action, ActionKind, Decision, Effect, GovernanceMode, Kernel, Severity, SqlDialect, SqlPolicy,
    SqlPolicyConfig, StatementKind, Verdict,
};
use serde::Serialize;

/// (case name, SQL text, SQLite dialect).
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
    // D11 bypass table (governance-semantics.md), rows 1-24
    ("d11_01_select", "SELECT name FROM users WHERE id = 42"),
    ("d11_02_drop", "DROP TABLE users"),
    ("d11_03_inline_comment", "drop/**/table users"),
    ("d11_04_mixed_case", "DrOp TABLE users"),
    ("d11_05_stacked", "SELECT 1; DROP TABLE users"),
    ("d11_06_tab", "DROP\tTABLE users"),
    ("d11_07_lf", "DROP\nTABLE users"),
    ("d11_08_nbsp", "DROP\u{a0}TABLE users"),
    ("d11_09_leading_comment", "/* hi */ DROP TABLE users"),
    ("d11_10_line_comment", "-- c\nDROP TABLE users"),
    ("d11_11_comment_between", "DROP/*x*/TABLE users"),
    (
        "d11_12_mysql_version_comment",
        "/*!50000 DROP TABLE users */",
    ),
    ("d11_13_delete", "DELETE FROM users"),
    ("d11_14_tautology", "DELETE FROM users WHERE 1=1"),
    ("d11_15_delete_comment", "delete/**/from users"),
    ("d11_16_tsql_delete", "DELETE users WHERE id > 0"),
    ("d11_17_string_literal_fp", "SELECT 'DROP TABLE users'"),
    ("d11_18_dropped_items_fp", "SELECT * FROM dropped_items"),
    ("d11_19_cyrillic", "DR\u{41e}P TABLE users"),
    (
        "d11_20_fullwidth",
        "\u{ff24}\u{ff32}\u{ff2f}\u{ff30} TABLE users",
    ),
    ("d11_21_execute", "EXECUTE 'DR' || 'OP TABLE users'"),
    (
        "d11_22_do_block",
        "DO $$ BEGIN EXECUTE 'DROP TABLE users'; END $$",
    ),
    ("d11_23_truncate", "TRUNCATE users"),
    (
        "d11_24_alter_drop_column",
        "ALTER TABLE users DROP COLUMN email",
    ),
    // agentmesh sql.verb facet cases
    ("facet_bom_drop", "\u{feff}DROP TABLE users"),
    (
        "facet_with_delete",
        "WITH x AS (SELECT 1) DELETE FROM users",
    ),
    // more evasion and side effects
    ("nul_byte", "SELECT 1\0; DROP TABLE users"),
    ("nested_comment", "SELECT 1 /* a /* b */ */"),
    ("dash_dash_no_space", "SELECT 1 --x"),
    ("load_extension", "SELECT load_extension('/tmp/evil.so')"),
    (
        "writefile_in_subquery",
        "SELECT 1 WHERE EXISTS (SELECT writefile('/tmp/x', 'y'))",
    ),
    ("select_into", "SELECT * INTO backup FROM users"),
    (
        "upsert",
        "INSERT INTO users (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET admin = 1",
    ),
    (
        "insert_or_replace",
        "INSERT OR REPLACE INTO users (id) VALUES (1)",
    ),
    ("vacuum_into", "VACUUM INTO '/tmp/copy.db'"),
    (
        "create_trigger",
        "CREATE TRIGGER t AFTER INSERT ON users BEGIN DELETE FROM users; END",
    ),
    ("prepare", "PREPARE p AS DELETE FROM users"),
    (
        "update_tautology_or",
        "UPDATE users SET admin = 1 WHERE id = 3 OR 'a' = 'a'",
    ),
    (
        "delete_like_percent",
        "DELETE FROM users WHERE name LIKE '%'",
    ),
    // Spider-style queries (with and without LIMIT)
    (
        "spider_limit_small",
        "SELECT name FROM stadium ORDER BY capacity DESC LIMIT 1",
    ),
    ("spider_limit_large", "SELECT name FROM singer LIMIT 5000"),
    (
        "spider_offset",
        "SELECT name FROM singer LIMIT 1000 OFFSET 10",
    ),
    (
        "spider_join_group",
        "SELECT T2.name, count(*) FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id GROUP BY T1.stadium_id",
    ),
    (
        "spider_between",
        "SELECT location, name FROM stadium WHERE capacity BETWEEN 5000 AND 10000",
    ),
    (
        "spider_case",
        "SELECT CASE WHEN age > 30 THEN 'old' ELSE 'young' END FROM singer",
    ),
];

#[derive(Serialize)]
struct Outcome {
    verdict: Verdict,
    findings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rewritten: Option<String>,
}

#[derive(Serialize)]
struct Row {
    name: &'static str,
    sql: &'static str,
    default: Outcome,
    read_only_max_rows_100: Outcome,
}

fn kernel() -> Kernel {
    Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::default())
}

fn kernel_with(config: SqlPolicyConfig) -> Kernel {
    Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::new(config))
}

fn read_only_100() -> SqlPolicyConfig {
    SqlPolicyConfig {
        read_only: true,
        max_rows: Some(100),
        ..SqlPolicyConfig::default()
    }
}

fn check(sql: &str) -> Decision {
    kernel().check(&Action::sql("concert_singer", sql)).unwrap()
}

fn check_with(config: SqlPolicyConfig, sql: &str) -> Decision {
    kernel_with(config)
        .check(&Action::sql("concert_singer", sql))
        .unwrap()
}

fn reasons(d: &Decision) -> Vec<String> {
    d.violations.iter().map(|v| v.reason.clone()).collect()
}

fn outcome(d: Decision) -> Outcome {
    Outcome {
        verdict: d.verdict,
        findings: d
            .violations
            .iter()
            .map(|v| format!("{} {}: {}", v.severity, v.effect, v.reason))
            .collect(),
        rewritten: match d.rewritten {
            Some(ActionKind::Sql { sql, .. }) => Some(sql),
            _ => None,
        },
    }
}

#[test]
fn fixture_table_has_enough_distinct_cases() {
    assert!(CASES.len() >= 100, "{}", CASES.len());
    let mut names: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), CASES.len(), "case names must be unique");
}

#[test]
fn fixture_verdicts_snapshot() {
    let k = kernel();
    let ro = kernel_with(read_only_100());
    let rows: Vec<Row> = CASES
        .iter()
        .map(|&(name, sql)| {
            let a = Action::sql("concert_singer", sql);
            Row {
                name,
                sql,
                default: outcome(k.check(&a).unwrap()),
                read_only_max_rows_100: outcome(ro.check(&a).unwrap()),
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
        "SELECT 'DROP TABLE users'",
        "SELECT * FROM dropped_items",
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
        "DELETE FROM users WHERE 1=1",
        "SELECT load_extension('/tmp/x.so')",
    ] {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        assert_eq!(d.max_severity(), Some(Severity::Critical), "{sql}");
        assert!(
            d.violations
                .iter()
                .all(|v| v.blocked() && v.policy == "sql_safety")
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
    assert_eq!(
        reasons(&d),
        vec!["DELETE without WHERE on table `singer` is not allowed"]
    );
}

#[test]
fn stacked_statements_get_one_extra_high_finding() {
    let d = check("SELECT 1; DELETE FROM t");
    let r = reasons(&d);
    assert_eq!(d.violations.len(), 2, "{r:?}");
    assert_eq!(d.violations[0].severity, Severity::Critical);
    assert_eq!(d.violations[1].severity, Severity::High);
    assert_eq!(r[1], "stacked statements (2): at most 1 allowed per action");

    let relaxed = kernel_with(SqlPolicyConfig {
        max_statements: 2,
        ..SqlPolicyConfig::default()
    });
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
        "DR\u{41e}P TABLE users",
    ] {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql:?}");
        assert_eq!(d.max_severity(), Some(Severity::Medium), "{sql:?}");
        assert_eq!(d.violations.len(), 1, "{sql:?}");
    }
    let r = &reasons(&check("SELEC name FROM singer"))[0];
    assert!(
        r.starts_with("SQL rejected, refusing to run it (fail closed): SQL does not parse"),
        "{r}"
    );
    assert!(r.contains("SELEC"), "{r}");
    assert_eq!(reasons(&check("")), vec!["empty SQL input (no statements)"]);
}

#[test]
fn suspicious_spellings_are_rejected_high_with_a_reason_naming_the_rule() {
    let cases = [
        ("SELECT 1\0", "U+0000 (NUL) at byte offset 8"),
        (
            "\u{feff}SELECT 1",
            "byte order mark U+FEFF at byte offset 0",
        ),
        ("SELECT\u{a0}1", "Unicode whitespace"),
        ("SELECT 1 /*!50000 , 2 */", "MySQL executable comment"),
        ("SELECT 1 /* a /* b */ */", "nested block comment"),
        ("SELECT 1 --x", "`--` not followed by whitespace"),
        (
            "SELECT 1 -- a\rb",
            "carriage return inside the `--` comment",
        ),
        ("SELECT 'a\\' AS x", "backslash before a quote"),
        ("SELECT 1 \u{200b}", "invisible formatting character"),
    ];
    for (sql, want) in cases {
        let d = check(sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql:?}");
        assert_eq!(d.max_severity(), Some(Severity::High), "{sql:?}");
        assert!(reasons(&d)[0].contains(want), "{sql:?}: {:?}", reasons(&d));
    }
}

#[test]
fn each_dialect_applies_its_comment_rules_and_fails_closed_on_differences() {
    let k = kernel();
    let run = |d: SqlDialect, sql: &str| k.check(&Action::sql("db", sql).with_dialect(d)).unwrap();
    // accepted comments in every dialect
    for d in SqlDialect::ALL {
        for sql in [
            "SELECT 1 -- note\n",
            "SELECT /* note */ 1",
            "SELECT 1 -- note",
        ] {
            assert_eq!(run(d, sql).verdict, Verdict::Allow, "{d}: {sql:?}");
        }
    }
    // `#` is a comment only in MySQL: rejected there, a syntax error elsewhere
    let d = run(SqlDialect::Mysql, "SELECT 1 # note");
    assert!(reasons(&d)[0].contains("`#` comment"), "{:?}", reasons(&d));
    assert_eq!(
        run(SqlDialect::Sqlite, "SELECT 1 # note").verdict,
        Verdict::Block
    );
    // MySQL: `--x` and `--<LF>` are two minus signs for sqlparser's MySQL dialect (MySQL itself
    // treats `--<LF>` as a comment): rejected, fail closed
    assert_eq!(
        run(SqlDialect::Mysql, "SELECT 1 --\n").verdict,
        Verdict::Block
    );
    assert_eq!(
        run(SqlDialect::Sqlite, "SELECT 1 --\n").verdict,
        Verdict::Allow
    );
    let d = run(SqlDialect::Mysql, "SELECT 1 --1");
    assert!(
        reasons(&d)[0].contains("`--` not followed by whitespace"),
        "{:?}",
        reasons(&d)
    );
    // PostgreSQL nests comments, SQLite does not: both reject nested comments
    for d in [SqlDialect::Postgres, SqlDialect::Sqlite] {
        assert!(reasons(&run(d, "SELECT 1 /* /* */ */"))[0].contains("nested block comment"));
    }
    // MySQL executable comments are rejected in every dialect
    for d in SqlDialect::ALL {
        let r = reasons(&run(d, "/*!50000 DROP TABLE users */"));
        assert!(r[0].contains("MySQL executable comment"), "{d}: {r:?}");
    }
    // PostgreSQL dollar quoting hides keywords inside a string
    assert_eq!(
        run(SqlDialect::Postgres, "SELECT $$DROP TABLE users$$").verdict,
        Verdict::Allow
    );
}

#[test]
fn dynamic_sql_is_denied_in_every_dialect_unless_allowed() {
    for d in SqlDialect::ALL {
        for sql in [
            "EXECUTE p",
            "EXEC sp_x",
            "PREPARE p AS SELECT 1",
            "DO $$ BEGIN EXECUTE 'DROP TABLE users'; END $$",
            "EXECUTE 'DR' || 'OP TABLE users'",
        ] {
            let dec = kernel()
                .check(&Action::sql("db", sql).with_dialect(d))
                .unwrap();
            assert_eq!(dec.verdict, Verdict::Block, "{d}: {sql}");
            let r = reasons(&dec);
            assert!(r[0].contains("dynamic SQL"), "{d}: {sql}: {r:?}");
        }
    }
    let lenient = kernel_with(SqlPolicyConfig {
        allowed: vec![StatementKind::Other("execute".into())],
        ..SqlPolicyConfig::default()
    });
    assert_eq!(
        lenient
            .check(&Action::sql("db", "EXECUTE p"))
            .unwrap()
            .verdict,
        Verdict::Allow
    );
}

#[test]
fn read_only_blocks_every_non_query_anywhere_in_the_tree() {
    let ro = SqlPolicyConfig {
        denied: vec![],
        read_only: true,
        allowed: vec![StatementKind::Other("vacuum".into())],
        ..SqlPolicyConfig::default()
    };
    for sql in [
        "INSERT INTO t VALUES (1)",
        "WITH d AS (DELETE FROM t WHERE id = 1 RETURNING *) SELECT * FROM d",
        "SELECT * INTO copy FROM t",
        "VACUUM",
        "CREATE VIEW v AS SELECT 1",
    ] {
        let d = check_with(ro.clone(), sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        assert!(
            reasons(&d)
                .iter()
                .any(|r| r.ends_with("the policy is read-only")),
            "{sql}: {:?}",
            reasons(&d)
        );
    }
    for sql in [
        "SELECT 1",
        "VALUES (1)",
        "SELECT a FROM t UNION SELECT b FROM u",
        "WITH x AS (SELECT 1) SELECT * FROM x",
    ] {
        assert_eq!(check_with(ro.clone(), sql).verdict, Verdict::Allow, "{sql}");
    }
}

#[test]
fn require_where_blocks_unrestricted_writes_even_when_the_kind_is_allowed() {
    let writes_ok = SqlPolicyConfig {
        denied: vec![StatementKind::Drop],
        ..SqlPolicyConfig::default()
    };
    let d = check_with(writes_ok.clone(), "DELETE FROM users WHERE 1=1");
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.max_severity(), Some(Severity::Critical));
    assert_eq!(
        reasons(&d),
        vec![
            "DELETE with tautological WHERE (`1 = 1`) on table `users` is not allowed: DELETE \
             must have a WHERE clause that restricts rows (require_where)"
        ]
    );
    for sql in [
        "DELETE FROM users",
        "UPDATE users SET a = 1",
        "UPDATE users SET a = 1 WHERE id = id",
        "DELETE FROM users WHERE name LIKE '%' OR id = 3",
        "DELETE FROM users WHERE NOT FALSE",
        "DELETE FROM users WHERE 1 IN (1, 2)",
    ] {
        let d = check_with(writes_ok.clone(), sql);
        assert_eq!(d.max_severity(), Some(Severity::Critical), "{sql}");
    }
    for sql in [
        "DELETE FROM users WHERE id = 3",
        "UPDATE users SET a = 1 WHERE id > 0",
    ] {
        assert_eq!(
            check_with(writes_ok.clone(), sql).verdict,
            Verdict::Allow,
            "{sql}"
        );
    }
    let no_requirement = SqlPolicyConfig {
        require_where: vec![],
        ..writes_ok
    };
    assert_eq!(
        check_with(no_requirement, "DELETE FROM users").verdict,
        Verdict::Allow
    );
}

#[test]
fn table_lists_check_every_reference_and_ignore_cte_names() {
    let deny = SqlPolicyConfig {
        tables: NameLists {
            allow: vec![],
            deny: vec!["Secrets".into()],
        },
        ..SqlPolicyConfig::default()
    };
    for sql in [
        "SELECT * FROM secrets",
        "SELECT * FROM main.SECRETS",
        "SELECT 1 FROM t JOIN \"secrets\" ON 1",
        "SELECT (SELECT max(x) FROM secrets)",
        "WITH a AS (SELECT * FROM secrets) SELECT * FROM a",
        "SELECT * FROM t WHERE id IN (SELECT id FROM secrets)",
        "SELECT * FROM secrets WHERE EXISTS (WITH secrets AS (SELECT 1) SELECT * FROM secrets)",
    ] {
        let d = check_with(deny.clone(), sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        let r = reasons(&d);
        assert_eq!(r.len(), 1, "{sql}: {r:?}");
        assert!(
            r[0].starts_with("table `") && r[0].ends_with("secrets` is denied"),
            "{sql}: {r:?}"
        );
    }
    assert_eq!(
        check_with(
            deny.clone(),
            "WITH secrets AS (SELECT 1) SELECT * FROM secrets"
        )
        .verdict,
        Verdict::Allow
    );
    let allow = SqlPolicyConfig {
        tables: NameLists {
            allow: vec!["singer".into(), "concert".into()],
            deny: vec![],
        },
        ..SqlPolicyConfig::default()
    };
    assert_eq!(
        check_with(
            allow.clone(),
            "WITH x AS (SELECT * FROM singer) SELECT * FROM x JOIN concert ON 1"
        )
        .verdict,
        Verdict::Allow
    );
    let d = check_with(allow, "SELECT * FROM singer, stadium");
    assert_eq!(
        reasons(&d),
        vec!["table `stadium` is not in the table allow-list"]
    );
}

#[test]
fn column_lists_resolve_aliases_and_fail_closed_on_star() {
    let deny = SqlPolicyConfig {
        columns: NameLists {
            allow: vec![],
            deny: vec!["users.password".into(), "ssn".into()],
        },
        ..SqlPolicyConfig::default()
    };
    for (sql, want) in [
        ("SELECT password FROM users", "column `password` is denied"),
        (
            "SELECT u.password FROM users AS u",
            "column `u.password` is denied",
        ),
        ("SELECT name FROM t WHERE SSN = 1", "column `ssn` is denied"),
        (
            "SELECT * FROM users",
            "`*` in SELECT cannot be checked against the column allow/deny list (fail closed): name the columns",
        ),
        (
            "SELECT u.* FROM users AS u",
            "`u.*` in SELECT cannot be checked",
        ),
    ] {
        let d = check_with(deny.clone(), sql);
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        assert!(reasons(&d)[0].starts_with(want), "{sql}: {:?}", reasons(&d));
    }
    // `password` of another table is fine; count(*) is not a `*` projection
    assert_eq!(
        check_with(deny.clone(), "SELECT password, count(*) FROM wifi").verdict,
        Verdict::Allow
    );
    let allow = SqlPolicyConfig {
        columns: NameLists {
            allow: vec!["name".into(), "singer.age".into()],
            deny: vec![],
        },
        ..SqlPolicyConfig::default()
    };
    for sql in [
        "SELECT name, age FROM singer",
        "SELECT s.name FROM singer AS s WHERE s.age > 3",
        "SELECT avg(n) FROM (SELECT count(name) AS n FROM singer)",
    ] {
        assert_eq!(
            check_with(allow.clone(), sql).verdict,
            Verdict::Allow,
            "{sql}"
        );
    }
    let d = check_with(allow, "SELECT name, capacity FROM singer JOIN stadium ON 1");
    assert_eq!(
        reasons(&d),
        vec!["column `capacity` is not in the column allow-list"]
    );
}

#[test]
fn max_rows_rewrites_unbounded_queries_to_exact_sql() {
    let config = SqlPolicyConfig {
        max_rows: Some(100),
        ..SqlPolicyConfig::default()
    };
    let k = kernel_with(config);
    let cases = [
        (
            "SELECT name FROM singer",
            Some("SELECT name FROM singer LIMIT 100"),
        ),
        (
            "select name from singer limit 5000",
            Some("SELECT name FROM singer LIMIT 100"),
        ),
        (
            "SELECT name FROM singer ORDER BY age LIMIT 1000 OFFSET 10",
            Some("SELECT name FROM singer ORDER BY age LIMIT 100 OFFSET 10"),
        ),
        (
            "SELECT name FROM singer LIMIT 5, 1000",
            Some("SELECT name FROM singer LIMIT 5, 100"),
        ),
        (
            "SELECT name FROM singer LIMIT -1",
            Some("SELECT name FROM singer LIMIT 100"),
        ),
        (
            "SELECT a FROM t UNION SELECT b FROM u",
            Some("SELECT a FROM t UNION SELECT b FROM u LIMIT 100"),
        ),
        ("SELECT name FROM singer LIMIT 100", None),
        ("SELECT name FROM singer LIMIT 3", None),
        // single-row aggregates are bounded by construction
        ("SELECT count(*) FROM singer", None),
        (
            "SELECT max(age) AS oldest, MIN(age) FROM singer WHERE age > 3",
            None,
        ),
        // ... but not with GROUP BY, a plain column or a window function
        (
            "SELECT country, count(*) FROM singer GROUP BY country",
            Some("SELECT country, count(*) FROM singer GROUP BY country LIMIT 100"),
        ),
        (
            "SELECT count(*) OVER () FROM singer",
            Some("SELECT count(*) OVER () FROM singer LIMIT 100"),
        ),
    ];
    for (sql, want) in cases {
        let action = Action::sql("concert_singer", sql).with_dialect(SqlDialect::Sqlite);
        let d = k.check(&action).unwrap();
        match want {
            Some(rewritten) => {
                assert_eq!(d.verdict, Verdict::Modify, "{sql}");
                assert_eq!(d.violations[0].effect, Effect::Modify);
                assert_eq!(d.violations[0].severity, Severity::Low);
                assert_eq!(
                    d.violations[0].reason,
                    "unbounded SELECT: LIMIT 100 added (max_rows)"
                );
                assert_eq!(
                    d.rewritten,
                    Some(ActionKind::Sql {
                        database: "concert_singer".into(),
                        sql: rewritten.into(),
                        dialect: SqlDialect::Sqlite,
                    }),
                    "{sql}"
                );
            }
            None => assert_eq!(d.verdict, Verdict::Allow, "{sql}"),
        }
    }
    // the dialect is kept; blocked or stacked input is never rewritten
    let d = k
        .check(&Action::sql("db", "SELECT 1").with_dialect(SqlDialect::Postgres))
        .unwrap();
    assert!(matches!(
        d.rewritten,
        Some(ActionKind::Sql { dialect: SqlDialect::Postgres, ref sql, .. }) if sql == "SELECT 1 LIMIT 100"
    ));
    for sql in [
        "SELECT 1; SELECT 2",
        "DELETE FROM t",
        "SELECT load_extension('x')",
    ] {
        let d = k.check(&Action::sql("db", sql)).unwrap();
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        assert!(d.rewritten.is_none());
    }
}

#[test]
fn config_deserializes_with_defaults_and_rejects_unknown_fields() {
    let c: SqlPolicyConfig = serde_json::from_str(
        r#"{"read_only": true, "max_rows": 50, "tables": {"deny": ["secrets"]},
            "columns": {"allow": ["name"]}, "require_where": ["delete"]}"#,
    )
    .unwrap();
    assert!(c.read_only);
    assert_eq!(c.max_rows, Some(50));
    assert_eq!(c.tables.deny, vec!["secrets"]);
    assert_eq!(c.columns.allow, vec!["name"]);
    assert_eq!(c.require_where, vec![StatementKind::Delete]);
    assert_eq!(c.denied, SqlPolicyConfig::default().denied);
    assert_eq!(c.max_statements, 1);
    let d = SqlPolicyConfig::default();
    assert_eq!(
        (d.read_only, d.max_rows, d.require_where.clone()),
        (
            false,
            None,
            vec![StatementKind::Update, StatementKind::Delete]
        )
    );
    assert!(serde_json::from_str::<SqlPolicyConfig>(r#"{"readonly": true}"#).is_err());
    assert!(serde_json::from_str::<SqlPolicyConfig>(r#"{"tables": {"alow": []}}"#).is_err());
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
    assert_eq!(
        SqlPolicy::classify("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d").unwrap(),
        vec![StatementKind::Select, StatementKind::Delete]
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

#[test]
fn column_free_where_clauses_count_as_unrestricted_even_when_writes_are_allowed() {
    // Writes allowed, WHERE required: what the `permissive` preset does.
    let k = kernel_with(SqlPolicyConfig {
        denied: vec![],
        ..SqlPolicyConfig::default()
    });
    for sql in [
        "DELETE FROM t WHERE 'a' LIKE 'a'",
        "DELETE FROM t WHERE abs(1)",
        "UPDATE t SET a = 1 WHERE CAST(1 AS INT)",
        "DELETE FROM t WHERE EXISTS (SELECT 1 FROM u)",
        "DELETE FROM t WHERE id = 3 OR abs(1)",
    ] {
        let d = k.check(&Action::sql("db", sql)).unwrap();
        assert_eq!(d.verdict, Verdict::Block, "{sql}");
        assert_eq!(d.max_severity(), Some(Severity::Critical), "{sql}");
    }
    for sql in [
        "DELETE FROM t WHERE id = 3",
        "DELETE FROM t WHERE id = 3 AND abs(1)",
        "UPDATE t SET a = 1 WHERE EXISTS (SELECT 1 FROM u WHERE u.x = t.id)",
    ] {
        let d = k.check(&Action::sql("db", sql)).unwrap();
        assert_eq!(d.verdict, Verdict::Allow, "{sql}: {:?}", d.violations);
    }
}
