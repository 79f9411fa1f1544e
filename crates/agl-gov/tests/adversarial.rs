#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Adversarial SQL: every line of `tests/data/adversarial_sql.txt` (destructive SQL written to
//! evade checks) and generated variants (1 MB input, 10,000-deep nesting, every corpus line
//! wrapped in random comments) must be BLOCKED by the default `SqlPolicy` in enforce mode;
//! every line of `tests/data/benign_sql.txt` must be allowed. Property tests: case, whitespace
//! and comment insertion never yields Allow; no input panics the kernel.

use agl_gov::{Action, Decision, GovernanceMode, Kernel, SqlDialect, SqlPolicy, Verdict};
use proptest::prelude::*;

/// Decodes `\t \n \r \f \0 \\ \u{XXXX}` escapes of a corpus line.
fn decode(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some('u') => {
                assert_eq!(chars.next(), Some('{'), "bad \\u escape in {line}");
                let hex: String = chars.by_ref().take_while(|c| *c != '}').collect();
                let code = u32::from_str_radix(&hex, 16).unwrap();
                out.push(char::from_u32(code).unwrap());
            }
            other => panic!("unknown escape \\{other:?} in {line}"),
        }
    }
    out
}

/// Non-comment lines of a corpus file: (dialect, decoded SQL, raw line).
fn corpus(text: &str) -> Vec<(SqlDialect, String, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (dialect, rest) = match l.split_once(':') {
                Some((d, rest)) if ["mysql", "postgres", "generic", "sqlite"].contains(&d) => {
                    (d.parse().unwrap(), rest)
                }
                _ => (SqlDialect::Sqlite, l),
            };
            (dialect, decode(rest), l.to_string())
        })
        .collect()
}

fn kernel() -> Kernel {
    Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::default())
}

fn check(k: &Kernel, dialect: SqlDialect, sql: &str) -> Decision {
    k.check(&Action::sql("db", sql).with_dialect(dialect))
        .unwrap()
}

/// Small deterministic generator (xorshift) for the "random comments" variants.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const COMMENTS: &[&str] = &[
    "/**/",
    "/* x */",
    "/* DROP TABLE t */",
    "/* ; */",
    "-- c\n",
    "--\n",
    "-- SELECT 1\n",
    "/*\n*/",
    " /* multi\nline */ ",
];

#[test]
fn every_adversarial_input_is_blocked() {
    let text = include_str!("data/adversarial_sql.txt");
    let lines = corpus(text);
    assert!(lines.len() >= 150, "corpus has only {} lines", lines.len());
    let k = kernel();
    let mut tried = 0usize;
    let mut blocked = 0usize;
    let mut failures = Vec::new();
    let mut record = |name: String, d: Decision| {
        tried += 1;
        if d.verdict == Verdict::Block {
            blocked += 1;
        } else {
            failures.push(format!("{name}: {:?} {:?}", d.verdict, d.violations));
        }
    };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for (dialect, sql, raw) in &lines {
        record(raw.clone(), check(&k, *dialect, sql));
        // the same line wrapped in random comments, three times
        for _ in 0..3 {
            let wrapped = format!("{}{sql}\n{}", rng.pick(COMMENTS), rng.pick(COMMENTS));
            record(format!("wrapped {raw}"), check(&k, *dialect, &wrapped));
        }
    }
    // generated: very long input, deep nesting, long operator chains
    let generated = [
        format!("SELECT 1; DROP TABLE users; -- {}", "a".repeat(1 << 20)),
        format!("SELECT '{}'", "x".repeat(1 << 20)),
        format!("SELECT {}1{}", "(".repeat(10_000), ")".repeat(10_000)),
        format!(
            "SELECT * FROM users WHERE id IN {}1{}",
            "(SELECT ".repeat(10_000),
            ")".repeat(10_000)
        ),
        format!(
            "DELETE FROM users WHERE {}1=1{}",
            "(".repeat(10_000),
            ")".repeat(10_000)
        ),
        format!("SELECT 1{}", " + 1".repeat(100_000)),
        format!("DELETE FROM users WHERE id = 1{}", " OR 1=1".repeat(50_000)),
        format!("{}DROP TABLE users", "/**/".repeat(100_000)),
        "(".repeat(100_000),
        format!("SELECT {}", "NOT ".repeat(10_000)),
        format!("SELECT {}1", "-".repeat(10_000)),
    ];
    for (i, sql) in generated.iter().enumerate() {
        record(
            format!("generated #{i}"),
            check(&k, SqlDialect::Sqlite, sql),
        );
    }
    println!("adversarial corpus: {tried} inputs tried, {blocked} blocked");
    assert!(failures.is_empty(), "not blocked:\n{}", failures.join("\n"));
    assert_eq!(tried, blocked);
}

/// The acceptance check of the policy presets: every corpus line is blocked by the `strict`
/// and `standard` kernels exactly as `agl policy check --policy examples/policies/strict.yaml`
/// builds them (from the example files, which a unit test keeps identical to the presets).
#[test]
fn every_adversarial_input_is_blocked_by_the_strict_and_standard_examples() {
    let lines = corpus(include_str!("data/adversarial_sql.txt"));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/policies");
    for preset in ["strict", "standard"] {
        let file = agl_gov::PolicyFile::load(&dir.join(format!("{preset}.yaml"))).unwrap();
        let k = file.build(&agl_gov::BuildEnv::default()).unwrap();
        let escaped: Vec<&str> = lines
            .iter()
            .filter(|(d, sql, _)| check(&k, *d, sql).verdict != Verdict::Block)
            .map(|(_, _, line)| line.as_str())
            .collect();
        println!(
            "adversarial corpus vs examples/policies/{preset}.yaml: {} inputs tried, {} blocked",
            lines.len(),
            lines.len() - escaped.len()
        );
        assert!(escaped.is_empty(), "{preset} let through: {escaped:#?}");
    }
}

#[test]
fn every_benign_input_is_allowed() {
    let lines = corpus(include_str!("data/benign_sql.txt"));
    assert!(lines.len() >= 30);
    let k = kernel();
    for (dialect, sql, raw) in &lines {
        let d = check(&k, *dialect, sql);
        assert_eq!(d.verdict, Verdict::Allow, "{raw}: {:?}", d.violations);
    }
    println!("benign corpus: {} inputs allowed", lines.len());
}

#[test]
fn corpus_escapes_decode() {
    assert_eq!(decode(r"a\tb\n\r\f\0\\\u{00A0}"), "a\tb\n\r\x0c\0\\\u{a0}");
}

/// Destructive statements as token lists (the proptest inserts separators between tokens).
const DESTRUCTIVE: &[&[&str]] = &[
    &["DROP", "TABLE", "users"],
    &["DELETE", "FROM", "users"],
    &["DELETE", "FROM", "users", "WHERE", "1", "=", "1"],
    &["UPDATE", "users", "SET", "admin", "=", "1"],
    &["TRUNCATE", "TABLE", "users"],
    &["ALTER", "TABLE", "users", "RENAME", "TO", "x"],
    &["ATTACH", "DATABASE", "'x.db'", "AS", "x"],
    &["INSERT", "INTO", "users", "VALUES", "(", "1", ")"],
    &["SELECT", "1", ";", "DROP", "TABLE", "users"],
    &["PRAGMA", "writable_schema", "=", "1"],
    &["SELECT", "load_extension", "(", "'x.so'", ")"],
    &[
        "WITH",
        "d",
        "AS",
        "(",
        "DELETE",
        "FROM",
        "users",
        "RETURNING",
        "*",
        ")",
        "SELECT",
        "1",
    ],
];

const SEPARATORS: &[&str] = &[
    " ",
    "\t",
    "\n",
    "\r",
    "\x0c",
    "\r\n",
    "\u{a0}",
    "\u{2028}",
    "\u{3000}",
    "\u{2003}",
    "\u{85}",
    "\u{feff}",
    "/**/",
    "/* x */",
    "/* DROP */",
    "-- c\n",
    "--\n",
    "/*!*/",
    "/*! */",
    "/* /* */ */",
    "#\n",
    "\u{200b}",
];

fn destructive_variant() -> impl Strategy<Value = String> {
    (
        0..DESTRUCTIVE.len(),
        proptest::collection::vec(
            (
                proptest::collection::vec(0..SEPARATORS.len(), 1..3),
                any::<u64>(),
            ),
            16,
        ),
    )
        .prop_map(|(which, seps)| {
            let tokens = DESTRUCTIVE[which];
            let mut out = String::new();
            for (i, tok) in tokens.iter().enumerate() {
                let (sep, case_bits) = &seps[i % seps.len()];
                for s in sep {
                    out.push_str(SEPARATORS[*s]);
                }
                for (j, c) in tok.chars().enumerate() {
                    if case_bits >> (j % 64) & 1 == 1 {
                        out.extend(c.to_uppercase());
                    } else {
                        out.extend(c.to_lowercase());
                    }
                }
            }
            out
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn case_whitespace_and_comments_never_make_destructive_sql_allowed(
        sql in destructive_variant(),
        d in 0..4usize,
    ) {
        let k = kernel();
        let decision = check(&k, SqlDialect::ALL[d], &sql);
        prop_assert_ne!(decision.verdict, Verdict::Allow, "{:?}", sql);
    }

    #[test]
    fn any_string_never_panics_and_nul_is_never_allowed(s in any::<String>(), d in 0..4usize) {
        let policy = SqlPolicy::default();
        let _ = policy.check_sql(&s); // outside the kernel's catch_unwind: a panic fails
        let decision = check(&kernel(), SqlDialect::ALL[d], &s);
        prop_assert!(decision.violations.iter().all(|v| !v.reason.contains("panicked")));
        if s.contains('\0') {
            prop_assert_eq!(decision.verdict, Verdict::Block);
        }
    }

    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let s = String::from_utf8_lossy(&bytes).into_owned();
        let policy = SqlPolicy::default();
        let _ = policy.check_sql(&s);
        let decision = check(&kernel(), SqlDialect::Sqlite, &s);
        if s.contains('\0') {
            prop_assert_eq!(decision.verdict, Verdict::Block);
        }
    }

    #[test]
    fn sql_shaped_strings_never_panic(
        s in "(SELECT|DELETE|DROP|WITH|\\(|\\)|;|'|\"|/\\*|\\*/|--|#|!|\\$\\$|[a-z]{1,3}|[0-9]|=| |\n|,|\\*){0,40}",
        d in 0..4usize,
    ) {
        let policy = SqlPolicy::default();
        let _ = policy.check_parsed(&agl_gov::parse_sql(&s, SqlDialect::ALL[d]));
    }
}
