//! Turning an action's SQL text into syntax trees, once, for every policy that needs them.
//!
//! Responsible for choosing the sqlparser dialect that matches [`SqlDialect`] and for parsing.
//! Not responsible for judging statements (see [`crate::policies::sql`]).

use sqlparser::ast::Statement;
use sqlparser::dialect::{Dialect, GenericDialect, MySqlDialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;

use crate::action::SqlDialect;

/// The result of parsing one action's SQL text.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedSql {
    result: Result<Vec<Statement>, String>,
}

impl ParsedSql {
    /// The top-level statements, or the reason the text was rejected (parser error message).
    pub fn statements(&self) -> Result<&[Statement], &str> {
        match &self.result {
            Ok(s) => Ok(s),
            Err(e) => Err(e),
        }
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

/// Parses `sql` as `dialect` (sqlparser's default recursion limit bounds nesting, so hostile
/// input produces an error rather than a stack overflow).
pub fn parse_sql(sql: &str, dialect: SqlDialect) -> ParsedSql {
    ParsedSql {
        result: Parser::parse_sql(dialect_of(dialect), sql).map_err(|e| e.to_string()),
    }
}
