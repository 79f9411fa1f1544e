//! Schema linking: how far a predicted query names the same tables and columns as the gold
//! one. A partial-credit signal for text-to-SQL reinforcement learning, after the
//! schema-linking reward of Reasoning-SQL (Pourreza et al. 2025, "Reasoning-SQL: Reinforcement
//! Learning with SQL Tailored Partial Rewards for Reasoning-Enhanced Text-to-SQL",
//! arXiv:2503.23157): the Jaccard similarity of the two queries' sets of schema items.
//!
//! A query's schema items are the words of its text (SQLite tokens, `sqlparser`'s tokenizer;
//! quoted identifiers included, string literals and keywords-only words not) that name a
//! table or a column of the database, compared case-insensitively (SQLite identifiers are).
//! Aliases such as `T1` are not schema items. Responsible for the similarity only; rewards
//! are decided by the training crates.

use std::collections::HashSet;

use sqlparser::dialect::SQLiteDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

use crate::schema::DbInfo;

/// The lowercase names of `db`'s tables and columns.
pub fn schema_names(db: &DbInfo) -> HashSet<String> {
    db.tables
        .iter()
        .flat_map(|t| std::iter::once(&t.name).chain(&t.columns))
        .map(|n| n.to_lowercase())
        .collect()
}

/// The schema items `sql` names: its words that are in `names` (lowercase). A text the
/// tokenizer cannot read (an unterminated string, say) names none.
pub fn schema_items(sql: &str, names: &HashSet<String>) -> HashSet<String> {
    let Ok(tokens) = Tokenizer::new(&SQLiteDialect {}, sql).tokenize() else {
        return HashSet::new();
    };
    tokens
        .into_iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.value.to_lowercase()),
            _ => None,
        })
        .filter(|w| names.contains(w))
        .collect()
}

/// The Jaccard similarity `|P ∩ G| / |P ∪ G|` of the schema items of `predicted` and `gold`
/// over `names` (see [`schema_names`]), in `[0, 1]`; 0 when neither names any.
pub fn schema_linking(predicted: &str, gold: &str, names: &HashSet<String>) -> f64 {
    let p = schema_items(predicted, names);
    let g = schema_items(gold, names);
    let union = p.union(&g).count();
    if union == 0 {
        return 0.0;
    }
    p.intersection(&g).count() as f64 / union as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::TableInfo;

    fn db() -> DbInfo {
        DbInfo {
            db_id: "concert_singer".into(),
            tables: vec![
                TableInfo {
                    name: "singer".into(),
                    columns: vec!["Singer_ID".into(), "Name".into(), "Age".into()],
                    rows: 6,
                    foreign_keys: vec![],
                },
                TableInfo {
                    name: "concert".into(),
                    columns: vec!["concert_ID".into(), "Year".into()],
                    rows: 6,
                    foreign_keys: vec![],
                },
            ],
        }
    }

    #[test]
    fn names_are_lowercase_tables_and_columns() {
        let names = schema_names(&db());
        let mut v: Vec<_> = names.into_iter().collect();
        v.sort();
        assert_eq!(
            v,
            [
                "age",
                "concert",
                "concert_id",
                "name",
                "singer",
                "singer_id",
                "year"
            ]
        );
    }

    #[test]
    fn items_skip_keywords_aliases_and_string_literals() {
        let names = schema_names(&db());
        let items = schema_items(
            "SELECT T1.\"Name\", count(*) FROM singer AS T1 WHERE T1.age > 'Year' GROUP BY name",
            &names,
        );
        let mut v: Vec<_> = items.into_iter().collect();
        v.sort();
        assert_eq!(v, ["age", "name", "singer"]);
    }

    #[test]
    fn jaccard_of_the_two_item_sets() {
        let names = schema_names(&db());
        let gold = "SELECT name FROM singer WHERE age > 30";
        assert_eq!(schema_linking(gold, gold, &names), 1.0);
        assert_eq!(
            schema_linking("SELECT * FROM singer", gold, &names),
            1.0 / 3.0
        );
        assert_eq!(
            schema_linking("SELECT year FROM concert", gold, &names),
            0.0
        );
        assert_eq!(schema_linking("no sql here", "neither", &names), 0.0);
        assert_eq!(schema_linking("SELECT 'unterminated", gold, &names), 0.0);
    }
}
