//! Reading a database's tables, columns, foreign keys and row counts from `sqlite_master`
//! ([`db_info`]).
//!
//! Responsible for opening the file read-only and describing it. Not responsible for running
//! arbitrary SQL (see [`crate::Executor`]) or for `tables.json`.

use std::collections::HashMap;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

use crate::error::SpiderError;

/// One table of a database. JSON fields: `name`, `columns`, `rows`, `foreign_keys` (absent
/// reads as none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    /// Table name as stored in `sqlite_master`.
    pub name: String,
    /// Column names in declaration order (from `pragma_table_info`).
    pub columns: Vec<String>,
    /// Number of rows (`SELECT count(*)`).
    pub rows: u64,
    /// The foreign keys this table declares, one per referencing column, in
    /// `pragma_foreign_key_list` order (a composite key gives one entry per column pair).
    #[serde(default)]
    pub foreign_keys: Vec<ForeignKey>,
}

/// One column of a declared foreign key: `table.column` references `ref_table.ref_column`
/// (the pair to join on). JSON fields: `column`, `ref_table`, `ref_column`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignKey {
    /// The referencing column of the declaring table.
    pub column: String,
    /// The referenced table, as written in the declaration.
    pub ref_table: String,
    /// The referenced column: as declared, or the referenced table's primary key when the
    /// declaration names none (`REFERENCES t` alone); `column`'s own name if the table has no
    /// single-column primary key either.
    pub ref_column: String,
}

/// The tables of one database, in `sqlite_master` order (internal `sqlite_*` tables excluded).
/// JSON fields: `db_id`, `tables`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DbInfo {
    /// The database id.
    pub db_id: String,
    /// Its tables.
    pub tables: Vec<TableInfo>,
}

impl DbInfo {
    /// Row count (rows) per table, keyed by the lowercase table name.
    pub fn row_counts(&self) -> HashMap<String, u64> {
        self.tables
            .iter()
            .map(|t| (t.name.to_lowercase(), t.rows))
            .collect()
    }

    /// The table whose name equals `name` case-insensitively (SQLite identifiers are
    /// case-insensitive).
    pub fn table(&self, name: &str) -> Option<&TableInfo> {
        self.tables
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
    }

    /// The table with the most rows (the first such in `sqlite_master` order on ties), if any.
    pub fn largest_table(&self) -> Option<&TableInfo> {
        self.tables
            .iter()
            .fold(None, |best: Option<&TableInfo>, t| match best {
                Some(b) if b.rows >= t.rows => Some(b),
                _ => Some(t),
            })
    }
}

/// Opens `path` with `SQLITE_OPEN_READ_ONLY` (never writable, never created).
pub(crate) fn open_read_only(db_id: &str, path: &Path) -> Result<Connection, SpiderError> {
    if !path.is_file() {
        return Err(SpiderError::MissingDatabase {
            db_id: db_id.to_string(),
            path: path.to_path_buf(),
        });
    }
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql_error(db_id, &e))
}

pub(crate) fn sql_error(db_id: &str, e: &rusqlite::Error) -> SpiderError {
    SpiderError::Sql {
        db_id: db_id.to_string(),
        message: e.to_string(),
    }
}

/// Describes the database at `path` (opened READ ONLY): every table of `sqlite_master` except
/// SQLite's internal `sqlite_*` tables, with column names, declared foreign keys and row counts.
///
/// Errors: [`SpiderError::MissingDatabase`] if the file does not exist, [`SpiderError::Sql`]
/// if it is not a readable SQLite database.
pub fn db_info(db_id: &str, path: &Path) -> Result<DbInfo, SpiderError> {
    let conn = open_read_only(db_id, path)?;
    describe(db_id, &conn).map_err(|e| sql_error(db_id, &e))
}

fn describe(db_id: &str, conn: &Connection) -> rusqlite::Result<DbInfo> {
    let names: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut tables = Vec::with_capacity(names.len());
    for name in names {
        let columns: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")?
            .query_map([&name], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let count: i64 = conn.query_row(
            &format!(
                "SELECT count(*) FROM {}",
                crate::sql::quote_ident_always(&name)
            ),
            [],
            |r| r.get(0),
        )?;
        let foreign_keys = foreign_keys(conn, &name)?;
        tables.push(TableInfo {
            name,
            columns,
            rows: u64::try_from(count).unwrap_or(0),
            foreign_keys,
        });
    }
    Ok(DbInfo {
        db_id: db_id.to_string(),
        tables,
    })
}

/// The foreign keys `table` declares (`pragma_foreign_key_list`, ordered by key id and column
/// sequence). A reference without a column resolves to the referenced table's single-column
/// primary key.
fn foreign_keys(conn: &Connection, table: &str) -> rusqlite::Result<Vec<ForeignKey>> {
    let rows: Vec<(String, String, Option<String>)> = conn
        .prepare(
            "SELECT \"from\", \"table\", \"to\" FROM pragma_foreign_key_list(?1) ORDER BY id, seq",
        )?
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(rows.len());
    for (column, ref_table, to) in rows {
        let ref_column = match to {
            Some(c) if !c.is_empty() => c,
            _ => primary_key(conn, &ref_table)?.unwrap_or_else(|| column.clone()),
        };
        out.push(ForeignKey {
            column,
            ref_table,
            ref_column,
        });
    }
    Ok(out)
}

/// The single primary-key column of `table`, if it has exactly one (none for a missing table).
fn primary_key(conn: &Connection, table: &str) -> rusqlite::Result<Option<String>> {
    let pk: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info(?1) WHERE pk > 0 ORDER BY pk")?
        .query_map([table], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(match pk.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_tables_columns_and_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toy.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE Singer(id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO Singer(name) VALUES ('a'), ('b'), ('c');
             CREATE TABLE \"odd name\"(x, singer REFERENCES Singer, y, z,
                 FOREIGN KEY (y, z) REFERENCES pair(a, b),
                 FOREIGN KEY (x) REFERENCES gone);
             CREATE INDEX idx ON Singer(name);",
        )
        .unwrap();
        drop(conn);
        let info = db_info("toy", &path).unwrap();
        assert_eq!(info.tables.len(), 2);
        assert_eq!(info.tables[0].name, "Singer");
        assert_eq!(info.tables[0].columns, vec!["id", "name"]);
        assert_eq!(info.tables[0].rows, 3);
        assert_eq!(info.tables[1].rows, 0);
        assert!(info.tables[0].foreign_keys.is_empty());
        let fk = |c: &str, t: &str, r: &str| ForeignKey {
            column: c.into(),
            ref_table: t.into(),
            ref_column: r.into(),
        };
        // `REFERENCES Singer` resolves to Singer's primary key; a composite key gives one entry
        // per column pair; a reference to a missing table keeps the column's own name
        let mut got = info.tables[1].foreign_keys.clone();
        got.sort_by(|a, b| a.column.cmp(&b.column));
        assert_eq!(
            got,
            vec![
                fk("singer", "Singer", "id"),
                fk("x", "gone", "x"),
                fk("y", "pair", "a"),
                fk("z", "pair", "b"),
            ]
        );
        assert_eq!(info.row_counts().get("singer"), Some(&3));
        assert_eq!(
            info.largest_table().map(|t| t.name.as_str()),
            Some("Singer")
        );
        assert_eq!(info.table("SINGER").map(|t| t.rows), Some(3));
    }

    #[test]
    fn missing_file_is_missing_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.sqlite");
        let err = db_info("nope", &path).unwrap_err();
        assert!(matches!(err, SpiderError::MissingDatabase { .. }), "{err}");
        assert!(!path.exists(), "db_info must not create the file");
    }
}
