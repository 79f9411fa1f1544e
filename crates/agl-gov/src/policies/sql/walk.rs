//! One pass over the syntax trees of an action, collecting what [`super::SqlPolicy`] judges.
//!
//! Responsible for visiting every node once (sqlparser's `Visitor`) and recording every
//! statement node (classified), every real table referenced (CTE names excluded, with SQL
//! scoping), every column reference, `*` projections, and calls of functions with side
//! effects. Not responsible for deciding what is allowed.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, Ident, ObjectName, Query, SelectItem, SetExpr, Statement, TableFactor, Visit, Visitor,
};

use super::display_name_lower;

/// Functions with side effects, by lowercase name, with what they do. Calling one anywhere is
/// a critical finding.
pub(crate) const SIDE_EFFECT_FUNCTIONS: &[(&str, &str)] = &[
    (
        "load_extension",
        "loads native code into the SQLite process",
    ),
    ("readfile", "reads a file from the server (SQLite fileio)"),
    ("writefile", "writes a file on the server (SQLite fileio)"),
    ("edit", "starts an editor on the server (SQLite CLI)"),
    (
        "fts3_tokenizer",
        "registers native code pointers (SQLite FTS3)",
    ),
    ("load_file", "reads a file from the server (MySQL)"),
    ("sys_exec", "runs a shell command (MySQL UDF)"),
    ("sys_eval", "runs a shell command (MySQL UDF)"),
    ("sleep", "stalls the server (MySQL)"),
    ("benchmark", "stalls the server (MySQL)"),
    ("pg_sleep", "stalls the server (PostgreSQL)"),
    ("pg_read_file", "reads a file from the server (PostgreSQL)"),
    (
        "pg_read_binary_file",
        "reads a file from the server (PostgreSQL)",
    ),
    ("pg_ls_dir", "lists server directories (PostgreSQL)"),
    (
        "lo_import",
        "reads a server file into a large object (PostgreSQL)",
    ),
    (
        "lo_export",
        "writes a large object to a server file (PostgreSQL)",
    ),
    ("dblink", "runs SQL on another server (PostgreSQL)"),
    ("dblink_exec", "runs SQL on another server (PostgreSQL)"),
    (
        "pg_terminate_backend",
        "kills a server process (PostgreSQL)",
    ),
    ("pg_cancel_backend", "cancels a server process (PostgreSQL)"),
    ("set_config", "changes server settings (PostgreSQL)"),
    (
        "pg_reload_conf",
        "reloads the server configuration (PostgreSQL)",
    ),
];

/// Whether a statement or query restricts its rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WhereState {
    /// No WHERE clause.
    Missing,
    /// A WHERE clause that is true for every row; the payload is its SQL text.
    Tautology(String),
    /// A WHERE clause that is not known to be a tautology.
    Present,
}

/// One classified statement node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub kind: super::StatementKind,
    /// Human description, e.g. "DELETE without WHERE on table `singer`".
    pub what: String,
    /// For DELETE / UPDATE: the state of the WHERE clause.
    pub filter: Option<WhereState>,
    /// Dynamic SQL (EXECUTE, PREPARE, …).
    pub dynamic: bool,
}

/// A column reference: optional qualifier (lowercase) and column name (lowercase).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ColumnRef {
    pub qualifier: Option<String>,
    pub name: String,
}

/// Everything collected from one action's statements.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    pub nodes: Vec<Node>,
    /// Lowercase names of side-effect functions called.
    pub functions: Vec<String>,
    /// Real tables referenced (lowercase display names, deduplicated).
    pub tables: Vec<String>,
    /// Column references (only when names are collected).
    pub columns: Vec<ColumnRef>,
    /// `(alias, table)` pairs of aliased tables, lowercase.
    pub aliases: Vec<(String, String)>,
    /// Names that are not tables: CTE names, derived-table aliases, select aliases.
    pub non_tables: Vec<String>,
    /// Descriptions of `*` / `t.*` projections (only when names are collected).
    pub wildcards: Vec<String>,
}

struct Frame {
    owner: usize,
    names: Vec<String>,
    ctes: Vec<usize>,
    visible: usize,
}

struct Walker {
    names: bool,
    facts: Facts,
    frames: Vec<Frame>,
}

fn lower(i: &Ident) -> String {
    i.value.to_lowercase()
}

fn addr(q: &Query) -> usize {
    std::ptr::from_ref(q) as usize
}

impl Walker {
    fn add_table(&mut self, name: &ObjectName) {
        let t = display_name_lower(name);
        if !self.facts.tables.contains(&t) {
            self.facts.tables.push(t);
        }
    }

    fn is_cte(&self, name: &ObjectName) -> bool {
        if name.0.len() != 1 {
            return false;
        }
        let t = display_name_lower(name);
        self.frames
            .iter()
            .any(|f| f.names.iter().take(f.visible).any(|n| *n == t))
    }

    fn select_items(&mut self, items: &[SelectItem], context: &str) {
        for item in items {
            match item {
                SelectItem::Wildcard(_) => self.facts.wildcards.push(format!("`*` in {context}")),
                SelectItem::QualifiedWildcard(q, _) => {
                    self.facts.wildcards.push(format!("`{q}` in {context}"))
                }
                SelectItem::ExprWithAlias { alias, .. } => {
                    self.facts.non_tables.push(lower(alias));
                }
                SelectItem::UnnamedExpr(_) => {}
            }
        }
    }

    /// Walks the set-operation tree of a query body (members are not `Query` nodes).
    fn set_expr(&mut self, body: &SetExpr) {
        match body {
            SetExpr::Select(s) => {
                if let Some(into) = &s.into {
                    self.facts.nodes.push(Node {
                        kind: super::StatementKind::Create,
                        what: format!("SELECT INTO table `{}`", super::display_name(&into.name)),
                        filter: None,
                        dynamic: false,
                    });
                    if self.names {
                        self.add_table(&into.name);
                    }
                }
                if self.names {
                    self.select_items(&s.projection, "SELECT");
                }
            }
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left);
                self.set_expr(right);
            }
            SetExpr::Table(t) if self.names => {
                let name = match (&t.schema_name, &t.table_name) {
                    (Some(s), Some(n)) => format!("{s}.{n}").to_lowercase(),
                    (None, Some(n)) => n.to_lowercase(),
                    _ => String::new(),
                };
                if !name.is_empty() && !self.facts.tables.contains(&name) {
                    self.facts.tables.push(name);
                }
            }
            _ => {}
        }
    }
}

impl Visitor for Walker {
    type Break = ();

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
        self.facts.nodes.push(super::classify(s));
        if !self.names {
            return ControlFlow::Continue(());
        }
        match s {
            Statement::Drop { names, .. } => names.iter().for_each(|n| self.add_table(n)),
            Statement::Truncate { table_names, .. } => {
                table_names.iter().for_each(|t| self.add_table(&t.name))
            }
            Statement::Delete(d) => {
                d.tables.iter().for_each(|n| self.add_table(n));
                if let Some(r) = &d.returning {
                    self.select_items(r, "RETURNING");
                }
            }
            Statement::Insert(i) => {
                for c in &i.columns {
                    self.facts.columns.push(ColumnRef {
                        qualifier: None,
                        name: lower(c),
                    });
                }
                if let Some(r) = &i.returning {
                    self.select_items(r, "RETURNING");
                }
            }
            Statement::Update {
                assignments,
                returning,
                ..
            } => {
                for a in assignments {
                    let targets: Vec<&ObjectName> = match &a.target {
                        sqlparser::ast::AssignmentTarget::ColumnName(n) => vec![n],
                        sqlparser::ast::AssignmentTarget::Tuple(v) => v.iter().collect(),
                    };
                    for n in targets {
                        if let Some(last) = n.0.last().and_then(|p| p.as_ident()) {
                            self.facts.columns.push(ColumnRef {
                                qualifier: None,
                                name: lower(last),
                            });
                        }
                    }
                }
                if let Some(r) = returning {
                    self.select_items(r, "RETURNING");
                }
            }
            Statement::CreateView { name, .. } => self.add_table(name),
            Statement::CreateTable(ct) => self.add_table(&ct.name),
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let me = addr(q);
        if let Some(f) = self.frames.last_mut()
            && let Some(j) = f.ctes.iter().position(|c| *c == me)
        {
            // Inside CTE j: CTEs 0..=j are visible (self-reference for recursive CTEs).
            f.visible = j + 1;
        }
        if let Some(with) = &q.with {
            let names: Vec<String> = with
                .cte_tables
                .iter()
                .map(|c| lower(&c.alias.name))
                .collect();
            if self.names {
                self.facts.non_tables.extend(names.iter().cloned());
            }
            self.frames.push(Frame {
                owner: me,
                ctes: with.cte_tables.iter().map(|c| addr(&c.query)).collect(),
                names,
                visible: 0,
            });
        }
        self.set_expr(&q.body);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let me = addr(q);
        if self.frames.last().is_some_and(|f| f.owner == me) {
            self.frames.pop();
        }
        if let Some(f) = self.frames.last_mut()
            && f.ctes.contains(&me)
        {
            // After a CTE body, the body of the query sees every CTE up to this one; after the
            // last one, all of them.
            f.visible = f
                .visible
                .max(f.ctes.iter().position(|c| *c == me).unwrap_or(0) + 1);
            if f.ctes.last() == Some(&me) {
                f.visible = f.names.len();
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, r: &ObjectName) -> ControlFlow<()> {
        if self.names && !self.is_cte(r) {
            self.add_table(r);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        if !self.names {
            return ControlFlow::Continue(());
        }
        match t {
            TableFactor::Table {
                name,
                alias: Some(a),
                ..
            } => {
                let target = display_name_lower(name);
                if !self.is_cte(name) {
                    self.facts.aliases.push((lower(&a.name), target));
                } else {
                    self.facts.non_tables.push(lower(&a.name));
                }
            }
            TableFactor::Derived { alias: Some(a), .. } => {
                self.facts.non_tables.push(lower(&a.name));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        match e {
            Expr::Function(f) => {
                if let Some(last) = f.name.0.last().and_then(|p| p.as_ident()) {
                    let name = last.value.to_ascii_lowercase();
                    if SIDE_EFFECT_FUNCTIONS.iter().any(|(n, _)| *n == name)
                        && !self.facts.functions.contains(&name)
                    {
                        self.facts.functions.push(name);
                    }
                }
            }
            Expr::Identifier(i) if self.names => self.facts.columns.push(ColumnRef {
                qualifier: None,
                name: lower(i),
            }),
            Expr::CompoundIdentifier(parts) if self.names => {
                if let [.., q, c] = parts.as_slice() {
                    self.facts.columns.push(ColumnRef {
                        qualifier: Some(lower(q)),
                        name: lower(c),
                    });
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// Walks `statements` once. With `names == false` only statement nodes and side-effect
/// functions are collected (the cheap path used when no table/column list is configured).
pub(crate) fn collect(statements: &[Statement], names: bool) -> Facts {
    let mut w = Walker {
        names,
        facts: Facts::default(),
        frames: Vec::new(),
    };
    for s in statements {
        let _ = s.visit(&mut w);
    }
    w.facts
}
