//! Features of a (question, candidate SQL) pair for the built-in policy model.
//!
//! Responsible for turning text into a fixed-size sparse vector; not for scoring (see `model`).
//!
//! Layout of one feature vector (`FEATURE_DIM` = `HASH_BUCKETS` + `DENSE_FEATURES` = 8,200 f32):
//! - `[0, 8192)`: hashed sparse features (FNV-1a 64 of a namespaced string, modulo 8,192), each
//!   counted and then squashed as `ln(1 + count)`:
//!   - `k:<kw>`: SQL keywords (`select`, `count`, `order`, `delete`, …) and operators (`>`, `;`, …);
//!   - `kb:<a>_<b>`: consecutive keyword/operator bigrams;
//!   - `x:<word>|<kw>`: every question word crossed with every distinct SQL keyword/operator,
//!     which lets a linear model learn "how many" ↔ `COUNT`, "average" ↔ `AVG`, "most" ↔ `DESC`;
//! - `[8192, 8200)`: dense question–SQL overlap features:
//!   0 share of SQL identifier pieces (split on `_`, lower-cased, plural `s` stripped) that occur
//!   in the question; 1 identifier pieces missing from the question ÷ 5; 2 SQL literals (numbers,
//!   strings) found in the question; 3 literals not found; 4 extra statements after the first;
//!   5 `ln(1 + tokens) / 4`; 6 1.0 when the SQL has literals and all occur in the question;
//!   7 1.0 when the SQL does not tokenize.
//!
//! SQL is tokenized with `sqlparser`'s SQLite tokenizer; questions are split on non-alphanumeric
//! characters. Everything is deterministic.

use std::collections::{BTreeMap, BTreeSet};

use sqlparser::dialect::SQLiteDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

/// Number of hashed buckets.
pub const HASH_BUCKETS: usize = 8192;
/// Number of dense overlap features.
pub const DENSE_FEATURES: usize = 8;
/// Length of one feature vector.
pub const FEATURE_DIM: usize = HASH_BUCKETS + DENSE_FEATURES;
/// Name of the feature layout above, recorded in scorer checkpoints (`model.features` of
/// `config.json`): a checkpoint trained on another layout is refused. Change it whenever the
/// layout or the hashing changes.
pub const FEATURES_VERSION: &str = "agl-features-v1";

/// A sparse feature vector: sorted `(index, value)` pairs with distinct indices < `FEATURE_DIM`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseFeatures(pub Vec<(u32, f32)>);

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn bucket(s: &str) -> u32 {
    (fnv1a(s) % HASH_BUCKETS as u64) as u32
}

fn stem(w: &str) -> String {
    let w = w.to_lowercase();
    if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") {
        w[..w.len() - 1].to_string()
    } else {
        w
    }
}

/// Lower-cased alphanumeric words of a question.
pub fn question_words(question: &str) -> Vec<String> {
    question
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Computes the features of `sql` as an answer to `question`.
pub fn featurize(question: &str, sql: &str) -> SparseFeatures {
    let q_words = question_words(question);
    let q_stems: BTreeSet<String> = q_words.iter().map(|w| stem(w)).collect();
    let q_lower = question.to_lowercase();
    let mut counts: BTreeMap<u32, f32> = BTreeMap::new();
    let mut add = |key: String| *counts.entry(bucket(&key)).or_insert(0.0) += 1.0;
    let mut dense = [0f32; DENSE_FEATURES];

    let tokens = match Tokenizer::new(&SQLiteDialect {}, sql).tokenize() {
        Ok(t) => t,
        Err(_) => {
            dense[7] = 1.0;
            Vec::new()
        }
    };
    let mut structural: Vec<String> = Vec::new();
    let (mut ident_found, mut ident_missing) = (0usize, 0usize);
    let (mut lit_found, mut lit_missing) = (0usize, 0usize);
    let mut statements = 0usize;
    let mut pending_statement = false;
    let mut n_tokens = 0usize;
    for tok in &tokens {
        match tok {
            Token::Whitespace(_) | Token::EOF => continue,
            _ => n_tokens += 1,
        }
        match tok {
            Token::Word(w) if w.keyword != Keyword::NoKeyword && w.quote_style.is_none() => {
                structural.push(w.value.to_lowercase());
                pending_statement = true;
            }
            Token::Word(w) => {
                pending_statement = true;
                for piece in w.value.split('_').filter(|p| !p.is_empty()) {
                    if q_stems.contains(&stem(piece)) {
                        ident_found += 1;
                    } else {
                        ident_missing += 1;
                    }
                }
            }
            Token::Number(n, _) => {
                pending_statement = true;
                if q_words.iter().any(|w| w == n) {
                    lit_found += 1;
                } else {
                    lit_missing += 1;
                }
            }
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => {
                pending_statement = true;
                let needle = s.trim_matches('%').to_lowercase();
                if !needle.is_empty() && q_lower.contains(&needle) {
                    lit_found += 1;
                } else {
                    lit_missing += 1;
                }
            }
            Token::SemiColon => {
                if pending_statement {
                    statements += 1;
                    pending_statement = false;
                }
                structural.push(";".into());
            }
            Token::Comma | Token::Period | Token::LParen | Token::RParen => {
                pending_statement = true;
            }
            other => {
                pending_statement = true;
                structural.push(other.to_string());
            }
        }
    }
    if pending_statement {
        statements += 1;
    }
    for s in &structural {
        add(format!("k:{s}"));
    }
    for pair in structural.windows(2) {
        add(format!("kb:{}_{}", pair[0], pair[1]));
    }
    let distinct: BTreeSet<&String> = structural.iter().collect();
    let q_distinct: BTreeSet<&String> = q_words.iter().collect();
    for w in &q_distinct {
        for s in &distinct {
            add(format!("x:{w}|{s}"));
        }
    }
    let idents = ident_found + ident_missing;
    dense[0] = if idents == 0 {
        0.0
    } else {
        ident_found as f32 / idents as f32
    };
    dense[1] = ident_missing as f32 / 5.0;
    dense[2] = lit_found as f32;
    dense[3] = lit_missing as f32;
    dense[4] = statements.saturating_sub(1) as f32;
    dense[5] = (1.0 + n_tokens as f32).ln() / 4.0;
    dense[6] = if lit_found + lit_missing > 0 && lit_missing == 0 {
        1.0
    } else {
        0.0
    };
    let mut out: Vec<(u32, f32)> = counts.into_iter().map(|(i, c)| (i, c.ln_1p())).collect();
    for (i, v) in dense.iter().enumerate() {
        if *v != 0.0 {
            out.push(((HASH_BUCKETS + i) as u32, *v));
        }
    }
    SparseFeatures(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(f: &SparseFeatures, i: usize) -> f32 {
        f.0.iter()
            .find(|(k, _)| *k as usize == HASH_BUCKETS + i)
            .map_or(0.0, |(_, v)| *v)
    }

    #[test]
    fn literal_overlap_separates_right_from_wrong_constants() {
        let q = "How many singers are older than 40?";
        let right = featurize(q, "SELECT count(*) FROM singer WHERE age > 40");
        let wrong = featurize(q, "SELECT count(*) FROM singer WHERE age > 25");
        assert_eq!(dense(&right, 2), 1.0);
        assert_eq!(dense(&right, 6), 1.0);
        assert_eq!(dense(&wrong, 3), 1.0);
        assert_eq!(dense(&wrong, 6), 0.0);
        assert_ne!(right, wrong);
    }

    #[test]
    fn stacked_statements_are_counted() {
        let f = featurize("q", "SELECT 1; DELETE FROM t");
        assert_eq!(dense(&f, 4), 1.0);
        let g = featurize("q", "SELECT 1;");
        assert_eq!(dense(&g, 4), 0.0);
    }

    #[test]
    fn indices_are_sorted_distinct_and_in_range() {
        let f = featurize(
            "What is the name of each singer?",
            "SELECT name FROM singer GROUP BY name",
        );
        let idx: Vec<u32> = f.0.iter().map(|(i, _)| *i).collect();
        let mut sorted = idx.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(idx, sorted);
        assert!(idx.iter().all(|i| (*i as usize) < FEATURE_DIM));
        assert!(f.0.len() > 10);
    }

    #[test]
    fn untokenizable_sql_is_flagged_not_fatal() {
        let f = featurize("q", "SELECT 'unterminated");
        assert_eq!(dense(&f, 7), 1.0);
    }
}
