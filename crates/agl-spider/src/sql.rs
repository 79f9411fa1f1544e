//! Small SQL text helpers: a lexical tokenizer, text normalisation, identifier quoting.
//!
//! Responsible for the cheap, parser-free text handling that candidate building needs.
//! Not responsible for parsing SQL into an AST (the evaluator uses `sqlparser` for that) or for
//! executing anything.

/// SQLite's keywords (<https://www.sqlite.org/lang_keywords.html>), uppercase, sorted.
const SQLITE_KEYWORDS: &[&str] = &[
    "ABORT",
    "ACTION",
    "ADD",
    "AFTER",
    "ALL",
    "ALTER",
    "ALWAYS",
    "ANALYZE",
    "AND",
    "AS",
    "ASC",
    "ATTACH",
    "AUTOINCREMENT",
    "BEFORE",
    "BEGIN",
    "BETWEEN",
    "BY",
    "CASCADE",
    "CASE",
    "CAST",
    "CHECK",
    "COLLATE",
    "COLUMN",
    "COMMIT",
    "CONFLICT",
    "CONSTRAINT",
    "CREATE",
    "CROSS",
    "CURRENT",
    "CURRENT_DATE",
    "CURRENT_TIME",
    "CURRENT_TIMESTAMP",
    "DATABASE",
    "DEFAULT",
    "DEFERRABLE",
    "DEFERRED",
    "DELETE",
    "DESC",
    "DETACH",
    "DISTINCT",
    "DO",
    "DROP",
    "EACH",
    "ELSE",
    "END",
    "ESCAPE",
    "EXCEPT",
    "EXCLUDE",
    "EXCLUSIVE",
    "EXISTS",
    "EXPLAIN",
    "FAIL",
    "FILTER",
    "FIRST",
    "FOLLOWING",
    "FOR",
    "FOREIGN",
    "FROM",
    "FULL",
    "GENERATED",
    "GLOB",
    "GROUP",
    "GROUPS",
    "HAVING",
    "IF",
    "IGNORE",
    "IMMEDIATE",
    "IN",
    "INDEX",
    "INDEXED",
    "INITIALLY",
    "INNER",
    "INSERT",
    "INSTEAD",
    "INTERSECT",
    "INTO",
    "IS",
    "ISNULL",
    "JOIN",
    "KEY",
    "LAST",
    "LEFT",
    "LIKE",
    "LIMIT",
    "MATCH",
    "MATERIALIZED",
    "NATURAL",
    "NO",
    "NOT",
    "NOTHING",
    "NOTNULL",
    "NULL",
    "NULLS",
    "OF",
    "OFFSET",
    "ON",
    "OR",
    "ORDER",
    "OTHERS",
    "OUTER",
    "OVER",
    "PARTITION",
    "PLAN",
    "PRAGMA",
    "PRECEDING",
    "PRIMARY",
    "QUERY",
    "RAISE",
    "RANGE",
    "RECURSIVE",
    "REFERENCES",
    "REGEXP",
    "REINDEX",
    "RELEASE",
    "RENAME",
    "REPLACE",
    "RESTRICT",
    "RETURNING",
    "RIGHT",
    "ROLLBACK",
    "ROW",
    "ROWS",
    "SAVEPOINT",
    "SELECT",
    "SET",
    "TABLE",
    "TEMP",
    "TEMPORARY",
    "THEN",
    "TIES",
    "TO",
    "TRANSACTION",
    "TRIGGER",
    "UNBOUNDED",
    "UNION",
    "UNIQUE",
    "UPDATE",
    "USING",
    "VACUUM",
    "VALUES",
    "VIEW",
    "VIRTUAL",
    "WHEN",
    "WHERE",
    "WINDOW",
    "WITH",
    "WITHOUT",
];

/// Quotes `name` with double quotes (doubling embedded `"`) unless it is a plain identifier
/// (`[A-Za-z_][A-Za-z0-9_]*`) that is not an SQLite keyword.
pub(crate) fn quote_ident(name: &str) -> String {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    let upper = name.to_ascii_uppercase();
    if plain && SQLITE_KEYWORDS.binary_search(&upper.as_str()).is_err() {
        name.to_string()
    } else {
        quote_ident_always(name)
    }
}

/// Always double-quotes `name`, doubling embedded `"`.
pub(crate) fn quote_ident_always(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `sql` without surrounding whitespace and trailing `;` (repeatedly).
pub(crate) fn trim_sql(sql: &str) -> &str {
    sql.trim()
        .trim_end_matches(|c: char| c == ';' || c.is_whitespace())
}

/// Splits `sql` into lexical tokens (slices of the input): quoted strings / identifiers
/// (`'..'`, `".."`, `` `..` ``, `[..]`) as one token, words (letters, digits, `_`, `.`, `$`),
/// two-character operators, and single punctuation characters. Comments are dropped.
pub(crate) fn tokenize(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        if b.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if b == b'-' && bytes.get(i + 1) == Some(&b'-') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if b == b'/' && bytes.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                i += 1;
            }
            i = (i + 2).min(bytes.len());
            continue;
        }
        if matches!(b, b'\'' | b'"' | b'`' | b'[') {
            let close = if b == b'[' { b']' } else { b };
            i += 1;
            loop {
                match bytes.get(i) {
                    None => break,
                    Some(&c) if c == close => {
                        if close != b']' && bytes.get(i + 1) == Some(&close) {
                            i += 2;
                        } else {
                            i += 1;
                            break;
                        }
                    }
                    Some(_) => i += 1,
                }
            }
            out.push(&sql[start..i]);
            continue;
        }
        let is_word =
            |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'$' || c >= 0x80;
        if is_word(b) {
            while i < bytes.len() && is_word(bytes[i]) {
                i += 1;
            }
            out.push(&sql[start..i]);
            continue;
        }
        let two = bytes.get(i..i + 2);
        if matches!(
            two,
            Some(b"<=" | b">=" | b"<>" | b"!=" | b"==" | b"||" | b"<<" | b">>")
        ) {
            i += 2;
        } else {
            i += 1;
        }
        out.push(&sql[start..i]);
    }
    out
}

/// Whether a token is a quoted string or identifier.
pub(crate) fn is_quoted(tok: &str) -> bool {
    tok.starts_with(['\'', '"', '`', '['])
}

/// Removes the quotes of a quoted identifier token (un-doubling embedded quotes).
pub(crate) fn unquote(tok: &str) -> String {
    let Some(first) = tok.chars().next() else {
        return String::new();
    };
    let close = match first {
        '"' => '"',
        '`' => '`',
        '\'' => '\'',
        '[' => ']',
        _ => return tok.to_string(),
    };
    let inner = tok.strip_prefix(first).unwrap_or(tok);
    let inner = inner.strip_suffix(close).unwrap_or(inner);
    if close == ']' {
        inner.to_string()
    } else {
        let doubled: String = [close, close].iter().collect();
        inner.replace(&doubled, &close.to_string())
    }
}

/// Case- and whitespace-normalised text of `sql`: tokens joined by one space, unquoted tokens
/// lowercased (quoted literals keep their case), trailing `;` dropped.
pub(crate) fn normalize(sql: &str) -> String {
    let toks = tokenize(trim_sql(sql));
    let mut out = String::with_capacity(sql.len());
    for t in toks {
        if !out.is_empty() {
            out.push(' ');
        }
        if is_quoted(t) {
            out.push_str(t);
        } else {
            out.push_str(&t.to_lowercase());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_sorted_for_binary_search() {
        assert!(SQLITE_KEYWORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn quoting_only_when_needed() {
        assert_eq!(quote_ident("singer"), "singer");
        assert_eq!(quote_ident("Order"), "\"Order\"");
        assert_eq!(quote_ident("odd name"), "\"odd name\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_ident("1abc"), "\"1abc\"");
    }

    #[test]
    fn tokenizer_keeps_strings_and_operators() {
        assert_eq!(
            tokenize("SELECT T1.name ,  count(*) FROM t WHERE a >= 'x y' -- c\n;"),
            vec![
                "SELECT", "T1.name", ",", "count", "(", "*", ")", "FROM", "t", "WHERE", "a", ">=",
                "'x y'", ";"
            ]
        );
        assert_eq!(tokenize("'it''s'"), vec!["'it''s'"]);
    }

    #[test]
    fn normalisation_ignores_case_and_spacing_but_not_literals() {
        assert_eq!(
            normalize("SELECT a ,  b FROM T;"),
            normalize("select a, b from t")
        );
        assert_ne!(normalize("SELECT 'Paris'"), normalize("SELECT 'paris'"));
    }

    #[test]
    fn trim_and_unquote() {
        assert_eq!(trim_sql("  SELECT 1 ; ;\n"), "SELECT 1");
        assert_eq!(unquote("\"a\"\"b\""), "a\"b");
        assert_eq!(unquote("[x y]"), "x y");
        assert_eq!(unquote("plain"), "plain");
    }
}
