//! Turning an action's SQL text into syntax trees, once, for every policy that needs them, and
//! refusing text whose meaning could differ between us and the engine that runs it.
//!
//! Responsible for choosing the sqlparser dialect that matches [`SqlDialect`], for the
//! hardening rules below, for tokenizing and parsing (once), and for a few facts computed on
//! the way (whether comments were present). Not responsible for judging statements (see
//! [`crate::policies::sql`]).
//!
//! # Rule: what the policies see is what the engine executes
//! A text is **rejected** (the [`ParsedSql`] holds a [`SqlRejection`] instead of statements;
//! the SQL policy blocks it) when any of these hold, in every dialect unless noted. The reason
//! names the rule and the byte offset (or line and column) of the offending text.
//!
//! | rule | why | kind |
//! |---|---|---|
//! | longer than [`MAX_SQL_BYTES`] bytes | bounded work per check | [`RejectionKind::TooComplex`] |
//! | C0 control character other than TAB, LF, CR, FF, or DEL (U+007F) — NUL included | SQLite stops reading at NUL, other engines do not | [`RejectionKind::Suspicious`] |
//! | byte order mark U+FEFF anywhere | a leading BOM hides the first keyword from naive checks; engines differ | `Suspicious` |
//! | C1 control characters U+0080–U+009F (NEL included) | invisible, engine-dependent | `Suspicious` |
//! | Unicode whitespace other than SPACE, TAB, LF, CR, FF (NBSP, U+2028, U+3000, …), even in string literals | sqlparser's SQLite/MySQL/PostgreSQL dialects read it as part of an identifier, the generic dialect as whitespace: never ambiguous for us if rejected | `Suspicious` |
//! | invisible formatting characters (zero-width space/joiners, bidi controls, soft hyphen, word joiner, variation selectors, tag characters) | they make the text read differently from what runs | `Suspicious` |
//! | a backslash immediately before `'` or `"` | MySQL reads an escaped quote, SQLite / PostgreSQL / standard SQL end the string there (write `''`) | `Suspicious` |
//! | MySQL executable comment `/*! … */`, `/*!50000 … */`, MariaDB `/*M! … */` | MySQL and MariaDB **execute** their content; they are never treated as comments, not even for a SQLite-bound action (a careless proxy may replay it on MySQL) | `Suspicious` |
//! | a block comment containing `/*` | PostgreSQL nests block comments, SQLite and MySQL do not | `Suspicious` |
//! | unterminated block comment `/* …` | the tokenizer rejects it | [`RejectionKind::Syntax`] |
//! | `--` not followed by whitespace (`--x`, `1--1`) | a comment in SQLite / PostgreSQL, two minus signs in MySQL | `Suspicious` |
//! | carriage return inside a `--` comment (not part of the final CRLF) | PostgreSQL ends the comment at CR, SQLite and MySQL at LF only | `Suspicious` |
//! | `#` comment (tokenized as a comment only in the MySQL dialect) | a comment only in MySQL | `Suspicious` |
//! | `#` outside quotes in any other dialect (`a # b`, `#>`, `name#`) | a comment in MySQL, an operator in PostgreSQL, part of a name in the generic dialect | `Suspicious` |
//! | an expression chain longer than [`MAX_CHAIN_TOKENS`] tokens along one nesting path | the syntax tree of `1+1+…+1` is as deep as the chain; bounded so that walking and dropping it cannot overflow the stack | `TooComplex` |
//! | nesting deeper than sqlparser's recursion limit ([`RECURSION_LIMIT`], parentheses / subqueries) | no stack overflow on `((((…` | `Syntax` |
//! | anything the dialect's tokenizer or parser rejects (look-alike letters such as Cyrillic `О` or full-width `ＤＲＯＰ` included) | fail closed | `Syntax` |
//!
//! Dynamic SQL that does not parse (`DO $$ … $$`, `EXECUTE 'DR' || 'OP …'`) is a syntax
//! rejection whose reason starts with "dynamic SQL".
//!
//! # Parser panics are parse failures, and silent
//! sqlparser panics on some inputs instead of returning an error (0.59 on
//! `SELECT * FROM t WHERE a REGEXP` in the SQLite dialect, in `parse_infix`). Tokenizing and
//! parsing run under `catch_unwind`: a panic is a [`RejectionKind::Syntax`] rejection whose
//! reason says the parser panicked and quotes its message, so the SQL policy blocks the text
//! exactly as it blocks text that does not parse. Nothing is printed: the first parse installs
//! one process-wide panic hook (`std::panic::set_hook`, once) that stays silent while the
//! current thread is inside the parser and hands every other panic to the hook it replaced.
//! The triggering text is written down where a decision already keeps it: the rejection
//! reason goes into the blocking finding, and the flight recorder stores it with the action's
//! SQL. [`parser_panics`] counts the panics of this process, and each one is logged at
//! `debug` level (target `agl_gov::sql_text`) with the text, for an upstream report; not at
//! `warn`, which a training run would print over its progress bar.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlparser::ast::Statement;
use sqlparser::dialect::{Dialect, GenericDialect, MySqlDialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Whitespace};

use crate::action::SqlDialect;

/// Longest SQL text accepted, in bytes (256 KiB); longer text is rejected.
pub const MAX_SQL_BYTES: usize = 256 * 1024;

/// Most tokens (other than whitespace, comments, `(`, `)`, `,`, `;`) allowed along one nesting
/// path of the text, i.e. summed over the open parentheses and counted since the last comma at
/// each level. Bounds the depth of left-deep operator chains (`1+1+…`, `a OR b OR …`).
pub const MAX_CHAIN_TOKENS: usize = 800;

/// sqlparser recursion limit used when parsing (nesting of parentheses, subqueries,
/// expressions).
pub const RECURSION_LIMIT: usize = 50;

/// Why a SQL text was rejected, in categories the SQL policy maps to severities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectionKind {
    /// The dialect's tokenizer or parser rejects the text (including look-alike characters,
    /// unterminated comments and excessive nesting).
    Syntax,
    /// The text uses a spelling whose meaning differs between engines or that hides text from
    /// readers (control characters, BOM, Unicode whitespace, MySQL executable comments,
    /// ambiguous comments, backslash-escaped quotes).
    Suspicious,
    /// The text is longer than [`MAX_SQL_BYTES`] or its expression chains are too long.
    TooComplex,
}

/// The reason a SQL text was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlRejection {
    /// Category of the rejection.
    pub kind: RejectionKind,
    /// Human sentence naming the rule broken and where (byte offset or line/column).
    pub reason: String,
}

/// The result of parsing one action's SQL text (see the module docs for the rejection rules).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedSql {
    result: Result<Vec<Statement>, SqlRejection>,
    dialect: SqlDialect,
    has_comments: bool,
}

impl ParsedSql {
    /// The top-level statements, or the reason the text was rejected.
    pub fn statements(&self) -> Result<&[Statement], &str> {
        match &self.result {
            Ok(s) => Ok(s),
            Err(e) => Err(&e.reason),
        }
    }

    /// The rejection, when the text was rejected.
    pub fn rejection(&self) -> Option<&SqlRejection> {
        self.result.as_ref().err()
    }

    /// The dialect the text was parsed as.
    pub fn dialect(&self) -> SqlDialect {
        self.dialect
    }

    /// Whether the text contained at least one (accepted) comment.
    pub fn has_comments(&self) -> bool {
        self.has_comments
    }
}

/// The sqlparser dialect for `d`.
pub(crate) fn dialect_of(d: SqlDialect) -> &'static dyn Dialect {
    match d {
        SqlDialect::Sqlite => &SQLiteDialect {},
        SqlDialect::Mysql => &MySqlDialect {},
        SqlDialect::Postgres => &PostgreSqlDialect {},
        SqlDialect::Generic => &GenericDialect {},
    }
}

fn reject(kind: RejectionKind, reason: String) -> SqlRejection {
    SqlRejection { kind, reason }
}

/// Parses `sql` as `dialect`, applying the rejection rules of the module docs first. Never
/// panics and never overflows the stack, whatever the input; a panic inside sqlparser is a
/// [`RejectionKind::Syntax`] rejection and prints nothing (see the module docs).
pub fn parse_sql(sql: &str, dialect: SqlDialect) -> ParsedSql {
    let mut has_comments = false;
    let result = match quietly(|| parse_checked(sql, dialect, &mut has_comments)) {
        Ok(result) => result,
        Err(message) => {
            PARSER_PANICS.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                target: "agl_gov::sql_text",
                sql,
                %dialect,
                message,
                "sqlparser panicked (a sqlparser bug; the text is rejected as not parsing)"
            );
            Err(reject(
                RejectionKind::Syntax,
                format!("SQL does not parse: the SQL parser panicked ({message})"),
            ))
        }
    };
    ParsedSql {
        result,
        dialect,
        has_comments,
    }
}

/// How many times sqlparser panicked in [`parse_sql`] in this process (each one a text
/// rejected as not parsing; see the module docs).
pub fn parser_panics() -> u64 {
    PARSER_PANICS.load(Ordering::Relaxed)
}

static PARSER_PANICS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread is inside [`quietly`]: the panic hook stays silent then.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once per process, the panic hook that is silent inside [`quietly`] and hands
/// every other panic to the hook installed before it.
fn install_quiet_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err(its message)` without printing anything.
fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    /// Restores the thread's previous flag, also when `f` unwinds.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(self.0));
        }
    }
    install_quiet_hook();
    let _restore = Restore(QUIET.with(|q| q.replace(true)));
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string())
    })
}

fn parse_checked(
    sql: &str,
    dialect: SqlDialect,
    has_comments: &mut bool,
) -> Result<Vec<Statement>, SqlRejection> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(reject(
            RejectionKind::TooComplex,
            format!(
                "SQL text of {} bytes is longer than the {MAX_SQL_BYTES}-byte limit",
                sql.len()
            ),
        ));
    }
    scan_characters(sql)?;
    let d = dialect_of(dialect);
    let tokens = Tokenizer::new(d, sql)
        .tokenize_with_location()
        .map_err(|e| reject(RejectionKind::Syntax, format!("SQL does not tokenize: {e}")))?;
    *has_comments = scan_tokens(&tokens)?;
    let first_word = tokens.iter().find_map(|t| match &t.token {
        Token::Word(w) => Some(w.value.to_ascii_uppercase()),
        Token::Whitespace(_) => None,
        _ => Some(String::new()),
    });
    Parser::new(d)
        .with_recursion_limit(RECURSION_LIMIT)
        .with_tokens_with_locations(tokens)
        .parse_statements()
        .map_err(|e| {
            let dynamic = matches!(
                first_word.as_deref(),
                Some("DO" | "EXECUTE" | "EXEC" | "PREPARE" | "DEALLOCATE")
            );
            let reason = if dynamic {
                format!(
                    "dynamic SQL (`{}`) does not parse and is not allowed: {e}",
                    first_word.unwrap_or_default()
                )
            } else {
                format!("SQL does not parse: {e}")
            };
            reject(RejectionKind::Syntax, reason)
        })
}

/// Invisible formatting characters that make text read differently from what runs.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FFA0}'
        | '\u{FFF0}'..='\u{FFFB}' | '\u{E0000}'..='\u{E0FFF}' | '\u{1D173}'..='\u{1D17A}')
}

/// Character-level rules: control characters, BOM, Unicode whitespace, invisible formatting
/// characters, backslash before a quote. ASCII text takes a byte-only fast path.
fn scan_characters(sql: &str) -> Result<(), SqlRejection> {
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x80 {
            if (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c)) || b == 0x7f {
                let name = match b {
                    0 => " (NUL)".to_string(),
                    0x0b => " (vertical tab)".to_string(),
                    0x7f => " (DEL)".to_string(),
                    _ => String::new(),
                };
                return Err(reject(
                    RejectionKind::Suspicious,
                    format!(
                        "control character U+{b:04X}{name} at byte offset {i}: engines disagree \
                         on it (SQLite stops reading at NUL), refusing the text"
                    ),
                ));
            }
            if b == b'\\' && matches!(bytes.get(i + 1), Some(b'\'' | b'"')) {
                return Err(reject(
                    RejectionKind::Suspicious,
                    format!(
                        "backslash before a quote at byte offset {i}: MySQL reads an escaped \
                         quote, SQLite and PostgreSQL end the string there (write '' instead)"
                    ),
                ));
            }
            i += 1;
            continue;
        }
        // Non-ASCII: decode the character starting here (i is always on a char boundary).
        let Some(c) = sql.get(i..).and_then(|rest| rest.chars().next()) else {
            return Err(reject(
                RejectionKind::Suspicious,
                format!("invalid character boundary at byte offset {i}"),
            ));
        };
        let what = if c == '\u{FEFF}' {
            Some("byte order mark")
        } else if ('\u{80}'..='\u{9F}').contains(&c) {
            Some("C1 control character")
        } else if c.is_whitespace() {
            Some("Unicode whitespace (engines disagree on whether it separates tokens)")
        } else if is_invisible_format(c) {
            Some("invisible formatting character")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(reject(
                RejectionKind::Suspicious,
                format!(
                    "{what} U+{:04X} at byte offset {i}: refusing text that may read differently \
                     from what the engine runs",
                    u32::from(c)
                ),
            ));
        }
        i += c.len_utf8();
    }
    Ok(())
}

fn at(t: &TokenWithSpan) -> String {
    format!("line {} column {}", t.span.start.line, t.span.start.column)
}

/// Token-level rules: comments whose meaning differs between engines, adjacent minus signs,
/// and the expression-chain bound. Returns whether any comment was present.
fn scan_tokens(tokens: &[TokenWithSpan]) -> Result<bool, SqlRejection> {
    let suspicious = |reason: String| Err(reject(RejectionKind::Suspicious, reason));
    let mut has_comments = false;
    // Tokens since the last separator at each open parenthesis level; their sum bounds the
    // depth of the syntax tree built from this nesting path.
    let mut levels: Vec<usize> = vec![0];
    let mut path: usize = 0;
    let mut previous: Option<&Token> = None;
    for t in tokens {
        match &t.token {
            Token::Whitespace(Whitespace::MultiLineComment(body)) => {
                has_comments = true;
                let b = body.as_bytes();
                if b.first() == Some(&b'!')
                    || (matches!(b.first(), Some(b'M' | b'm')) && b.get(1) == Some(&b'!'))
                {
                    return suspicious(format!(
                        "MySQL executable comment `/*!…*/` at {}: MySQL and MariaDB run its \
                         content, so it is never treated as a comment",
                        at(t)
                    ));
                }
                if body.contains("/*") {
                    return suspicious(format!(
                        "nested block comment at {}: PostgreSQL nests `/* */` comments, SQLite \
                         and MySQL do not",
                        at(t)
                    ));
                }
            }
            Token::Whitespace(Whitespace::SingleLineComment { comment, prefix }) => {
                has_comments = true;
                if prefix != "--" {
                    return suspicious(format!(
                        "`{prefix}` comment at {}: a comment only in some engines (MySQL)",
                        at(t)
                    ));
                }
                if let Some(c) = comment.chars().next()
                    && !matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c')
                {
                    return suspicious(format!(
                        "`--` not followed by whitespace at {}: a comment in SQLite and \
                         PostgreSQL but two minus signs in MySQL",
                        at(t)
                    ));
                }
                let body = comment.strip_suffix('\n').unwrap_or(comment);
                let body = body.strip_suffix('\r').unwrap_or(body);
                if body.contains('\r') {
                    return suspicious(format!(
                        "carriage return inside the `--` comment at {}: PostgreSQL ends the \
                         comment there, SQLite and MySQL do not",
                        at(t)
                    ));
                }
            }
            Token::Whitespace(_) => {
                previous = None;
                continue;
            }
            token if hash_outside_quotes(token) => {
                return suspicious(format!(
                    "`#` outside quotes at {}: a comment in MySQL, an operator or part of a \
                     name in other engines",
                    at(t)
                ));
            }
            Token::Minus if previous == Some(&Token::Minus) => {
                return suspicious(format!(
                    "`--` not followed by whitespace at {}: two minus signs in MySQL, a comment \
                     in SQLite and PostgreSQL",
                    at(t)
                ));
            }
            Token::LParen => levels.push(0),
            Token::RParen => {
                if levels.len() > 1 {
                    path -= levels.pop().unwrap_or(0);
                }
            }
            Token::Comma | Token::SemiColon => {
                if let Some(last) = levels.last_mut() {
                    path -= *last;
                    *last = 0;
                }
            }
            _ => {
                if let Some(last) = levels.last_mut() {
                    *last += 1;
                    path += 1;
                }
                if path > MAX_CHAIN_TOKENS {
                    return Err(reject(
                        RejectionKind::TooComplex,
                        format!(
                            "expression too long or too deeply nested at {} (more than \
                             {MAX_CHAIN_TOKENS} tokens along one nesting path)",
                            at(t)
                        ),
                    ));
                }
            }
        }
        previous = Some(&t.token);
    }
    Ok(has_comments)
}

/// Whether a (non-comment) token carries a `#` that is not inside a string literal or a
/// quoted name: MySQL reads it as the start of a comment, PostgreSQL as an operator and the
/// generic dialect as part of a name, so the same text runs differently per engine.
fn hash_outside_quotes(token: &Token) -> bool {
    match token {
        Token::Word(w) => w.quote_style.is_none() && w.value.contains('#'),
        Token::SingleQuotedString(_)
        | Token::DoubleQuotedString(_)
        | Token::TripleSingleQuotedString(_)
        | Token::TripleDoubleQuotedString(_)
        | Token::DollarQuotedString(_)
        | Token::SingleQuotedByteStringLiteral(_)
        | Token::DoubleQuotedByteStringLiteral(_)
        | Token::TripleSingleQuotedByteStringLiteral(_)
        | Token::TripleDoubleQuotedByteStringLiteral(_)
        | Token::SingleQuotedRawStringLiteral(_)
        | Token::DoubleQuotedRawStringLiteral(_)
        | Token::TripleSingleQuotedRawStringLiteral(_)
        | Token::TripleDoubleQuotedRawStringLiteral(_)
        | Token::NationalStringLiteral(_)
        | Token::EscapedStringLiteral(_)
        | Token::UnicodeStringLiteral(_)
        | Token::HexStringLiteral(_)
        | Token::Whitespace(_) => false,
        // Operators (`#`, `##`, `#>`, `#>>`, `#-`, `?#`), placeholders and anything a later
        // sqlparser adds: fail closed on any `#` in their text.
        other => other.to_string().contains('#'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(sql: &str, d: SqlDialect) -> Option<SqlRejection> {
        parse_sql(sql, d).rejection().cloned()
    }

    #[test]
    fn plain_sql_parses_in_every_dialect() {
        for d in SqlDialect::ALL {
            let p = parse_sql("SELECT name FROM singer -- names\nWHERE age > 3", d);
            assert_eq!(p.statements().unwrap().len(), 1, "{d}");
            assert!(p.has_comments());
            assert_eq!(p.dialect(), d);
        }
    }

    #[test]
    fn nul_and_controls_are_rejected_with_offset() {
        let r = rejection("SELECT 1\0; DROP TABLE t", SqlDialect::Sqlite).unwrap();
        assert_eq!(r.kind, RejectionKind::Suspicious);
        assert!(
            r.reason.contains("U+0000 (NUL) at byte offset 8"),
            "{}",
            r.reason
        );
        for ok in ["SELECT\t1", "SELECT\r\n1", "SELECT\x0c1"] {
            assert!(rejection(ok, SqlDialect::Sqlite).is_none(), "{ok:?}");
        }
    }

    #[test]
    fn executable_and_ambiguous_comments_are_rejected_in_every_dialect() {
        for d in SqlDialect::ALL {
            for sql in [
                "/*!50000 DROP TABLE users */",
                "SELECT 1 /*! ; DROP TABLE users */",
                "SELECT 1 /*M! ; DROP TABLE users */",
                "SELECT 1 /* a /* b */ ; DROP TABLE t; /* */ */",
                "SELECT 1 --x",
                "SELECT 1 -- x\r DROP TABLE t",
            ] {
                let r = rejection(sql, d);
                assert!(r.is_some(), "{d}: {sql:?}");
            }
        }
        let r = rejection("SELECT 1 # c", SqlDialect::Mysql).unwrap();
        assert!(r.reason.contains("`#` comment"), "{}", r.reason);
        let r = rejection("SELECT 1 /* open", SqlDialect::Sqlite).unwrap();
        assert_eq!(r.kind, RejectionKind::Syntax);
        assert!(r.reason.contains("multi-line comment"), "{}", r.reason);
    }

    #[test]
    fn a_hash_outside_quotes_is_rejected_in_every_dialect() {
        // Found by the adversarial property test: PostgreSQL reads `load_extension # ('x.so')`
        // as an XOR, the generic dialect reads `load_extension#` as a name, MySQL reads a
        // comment and so calls load_extension('x.so').
        for d in SqlDialect::ALL {
            for sql in [
                "/**/select load_extension#\n( 'x.so'/**/)",
                "SELECT load_extension #\n('x.so')",
                "SELECT a # b FROM t",
                "SELECT doc #> '{a}' FROM t",
                "SELECT doc #- '{a}' FROM t",
            ] {
                let r = rejection(sql, d);
                assert!(r.is_some(), "{d}: {sql:?}");
                assert_eq!(r.unwrap().kind, RejectionKind::Suspicious, "{d}: {sql:?}");
            }
            for sql in [
                "SELECT name FROM t WHERE tag = '#1'",
                "SELECT \"col#1\" FROM t",
            ] {
                assert!(rejection(sql, d).is_none(), "{d}: {sql:?}");
            }
        }
    }

    #[test]
    fn deep_and_long_input_is_an_error_not_a_stack_overflow() {
        let deep = format!("SELECT {}1{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(rejection(&deep, SqlDialect::Sqlite).is_some());
        let chain = format!("SELECT 1{}", " + 1".repeat(5_000));
        let r = rejection(&chain, SqlDialect::Sqlite).unwrap();
        assert_eq!(r.kind, RejectionKind::TooComplex);
        let long = format!("SELECT '{}'", "a".repeat(MAX_SQL_BYTES));
        assert_eq!(
            rejection(&long, SqlDialect::Sqlite).unwrap().kind,
            RejectionKind::TooComplex
        );
        // long IN lists are fine: commas separate siblings
        let list = format!("SELECT 1 WHERE 1 IN ({})", vec!["1"; 3000].join(", "));
        assert!(rejection(&list, SqlDialect::Sqlite).is_none());
    }
}
