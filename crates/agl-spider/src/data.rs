//! Loading the vendored Spider 1.0 question files (`train_spider_compact.json`, `dev.json`).
//!
//! Responsible for reading the `question`, `query` and `db_id` fields, reporting malformed
//! files precisely, and skipping (and counting) questions whose database file is absent.
//! Not responsible for reading `tables.json` or opening databases (see [`crate::db_info`] and
//! [`crate::Executor`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use agl_core::json_kind;

use crate::error::SpiderError;

/// File name of the train split under the data root (7000 questions; fields `question`,
/// `query`, `db_id`).
pub const TRAIN_FILE: &str = "train_spider_compact.json";
/// File name of the dev split under the data root (1034 questions; only `question`, `query`,
/// `db_id` are read, the other fields are ignored).
pub const DEV_FILE: &str = "dev.json";
/// Directory under the data root holding `<db_id>/<db_id>.sqlite`.
pub const DATABASE_DIR: &str = "database";

/// Which Spider split a question comes from. Serialised (serde) and displayed as `"train"` /
/// `"dev"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// `train_spider_compact.json`.
    Train,
    /// `dev.json`.
    Dev,
}

impl Split {
    /// The lowercase name, `"train"` or `"dev"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Dev => "dev",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Spider question. JSON fields: `split`, `index`, `db_id`, `question`, `gold_sql`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    /// The split the question belongs to.
    pub split: Split,
    /// 0-based position of the question in its file (counting skipped questions too).
    pub index: usize,
    /// The database id (`db_id` in the Spider files).
    pub db_id: String,
    /// The natural-language question (`question`).
    pub question: String,
    /// The gold SQL as written in the file (`query`).
    pub gold_sql: String,
}

/// Questions skipped in one split because their database file is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipReport {
    /// Number of skipped questions (count) per missing `db_id`.
    pub missing_db: BTreeMap<String, usize>,
}

impl SkipReport {
    /// Total number of skipped questions in the split.
    pub fn total(&self) -> usize {
        self.missing_db.values().sum()
    }
}

/// The Spider data set as vendored under `data/spider`: questions whose database exists, plus
/// a report of the skipped ones.
#[derive(Debug, Clone)]
pub struct SpiderDataset {
    /// The data root (the directory holding `dev.json` and `database/`).
    pub root: PathBuf,
    /// Train questions with a database (6904 of 7000 in the vendored copy).
    pub train: Vec<Question>,
    /// Dev questions with a database (972 of 1034 in the vendored copy).
    pub dev: Vec<Question>,
    /// Train questions skipped for a missing database.
    pub train_skipped: SkipReport,
    /// Dev questions skipped for a missing database.
    pub dev_skipped: SkipReport,
}

impl SpiderDataset {
    /// Loads both splits from `root` (e.g. `data/spider`).
    ///
    /// Errors: [`SpiderError::MissingDir`] if `root` or `root/database` is not a directory,
    /// [`SpiderError::MissingFile`] if a split file is absent, [`SpiderError::Json`] (with
    /// line and column) for malformed JSON, [`SpiderError::Field`] (with the question index)
    /// for a missing or non-string `question` / `query` / `db_id`.
    pub fn load(root: &Path) -> Result<Self, SpiderError> {
        if !root.is_dir() {
            return Err(SpiderError::MissingDir {
                path: root.to_path_buf(),
            });
        }
        let db_dir = root.join(DATABASE_DIR);
        if !db_dir.is_dir() {
            return Err(SpiderError::MissingDir { path: db_dir });
        }
        let mut present: HashMap<String, bool> = HashMap::new();
        let (train, train_skipped) =
            load_split(&root.join(TRAIN_FILE), Split::Train, &db_dir, &mut present)?;
        let (dev, dev_skipped) =
            load_split(&root.join(DEV_FILE), Split::Dev, &db_dir, &mut present)?;
        Ok(Self {
            root: root.to_path_buf(),
            train,
            dev,
            train_skipped,
            dev_skipped,
        })
    }

    /// Path of the SQLite file for `db_id`: `root/database/<db_id>/<db_id>.sqlite` (it may not
    /// exist).
    pub fn db_path(&self, db_id: &str) -> PathBuf {
        db_file(&self.root.join(DATABASE_DIR), db_id)
    }

    /// The questions of `split`.
    pub fn questions(&self, split: Split) -> &[Question] {
        match split {
            Split::Train => &self.train,
            Split::Dev => &self.dev,
        }
    }

    /// Sorted, distinct database ids used by the kept questions of `split` (only databases
    /// whose file is present).
    pub fn database_ids(&self, split: Split) -> Vec<String> {
        self.questions(split)
            .iter()
            .map(|q| q.db_id.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}

/// `db_dir/<db_id>/<db_id>.sqlite`.
pub(crate) fn db_file(db_dir: &Path, db_id: &str) -> PathBuf {
    db_dir.join(db_id).join(format!("{db_id}.sqlite"))
}

/// Whether `db_id` is a plain name (no path separators, no `..`), so that it cannot point
/// outside the database directory.
pub(crate) fn is_plain_db_id(db_id: &str) -> bool {
    !db_id.is_empty() && db_id != "." && db_id != ".." && !db_id.contains(['/', '\\', '\0'])
}

fn load_split(
    path: &Path,
    split: Split,
    db_dir: &Path,
    present: &mut HashMap<String, bool>,
) -> Result<(Vec<Question>, SkipReport), SpiderError> {
    let raw = parse_question_file(path)?;
    let mut kept = Vec::with_capacity(raw.len());
    let mut skipped = SkipReport::default();
    for (index, (db_id, question, gold_sql)) in raw.into_iter().enumerate() {
        let exists = *present
            .entry(db_id.clone())
            .or_insert_with(|| is_plain_db_id(&db_id) && db_file(db_dir, &db_id).is_file());
        if exists {
            kept.push(Question {
                split,
                index,
                db_id,
                question,
                gold_sql,
            });
        } else {
            *skipped.missing_db.entry(db_id).or_insert(0) += 1;
        }
    }
    Ok((kept, skipped))
}

/// Reads a question file into `(db_id, question, query)` triples, in file order.
fn parse_question_file(path: &Path) -> Result<Vec<(String, String, String)>, SpiderError> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            SpiderError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            SpiderError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| SpiderError::Json {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let serde_json::Value::Array(items) = value else {
        return Err(SpiderError::Json {
            path: path.to_path_buf(),
            line: 1,
            column: 1,
            message: format!(
                "expected a top-level array of question objects, found {}",
                json_kind(&value)
            ),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let field = |name: &str| -> Result<String, SpiderError> {
                let err = |message: String| SpiderError::Field {
                    path: path.to_path_buf(),
                    index,
                    message,
                };
                let serde_json::Value::Object(map) = item else {
                    return Err(err(format!(
                        "expected an object, found {}",
                        json_kind(item)
                    )));
                };
                match map.get(name) {
                    None => Err(err(format!("missing field `{name}`"))),
                    Some(serde_json::Value::String(s)) => Ok(s.clone()),
                    Some(other) => Err(err(format!(
                        "field `{name}` must be a string, found {}",
                        json_kind(other)
                    ))),
                }
            };
            Ok((field("db_id")?, field("question")?, field("query")?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_root(train: &str, dev: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("database/toy")).unwrap();
        std::fs::write(dir.path().join("database/toy/toy.sqlite"), b"").unwrap();
        std::fs::write(dir.path().join(TRAIN_FILE), train).unwrap();
        std::fs::write(dir.path().join(DEV_FILE), dev).unwrap();
        dir
    }

    #[test]
    fn keeps_present_dbs_and_counts_missing_ones() {
        let train = r#"[{"question":"q0","query":"SELECT 1","db_id":"toy"},
                        {"question":"q1","query":"SELECT 2","db_id":"gone"},
                        {"question":"q2","query":"SELECT 3","db_id":"gone"}]"#;
        let dev = r#"[{"question":"d0","query":"SELECT 4","db_id":"toy","extra":[1,2]}]"#;
        let dir = write_root(train, dev);
        let ds = SpiderDataset::load(dir.path()).unwrap();
        assert_eq!(ds.train.len(), 1);
        assert_eq!(ds.train[0].index, 0);
        assert_eq!(ds.train_skipped.missing_db.get("gone"), Some(&2));
        assert_eq!(ds.train_skipped.total(), 2);
        assert_eq!(ds.dev[0].gold_sql, "SELECT 4");
        assert_eq!(ds.dev[0].split, Split::Dev);
        assert_eq!(ds.dev_skipped.total(), 0);
        assert_eq!(ds.database_ids(Split::Train), vec!["toy".to_string()]);
    }

    #[test]
    fn index_counts_skipped_questions() {
        let train = r#"[{"question":"q0","query":"SELECT 1","db_id":"gone"},
                        {"question":"q1","query":"SELECT 2","db_id":"toy"}]"#;
        let dir = write_root(train, "[]");
        let ds = SpiderDataset::load(dir.path()).unwrap();
        assert_eq!(ds.train[0].index, 1);
    }

    #[test]
    fn wrong_field_type_names_file_and_index() {
        let train = r#"[{"question":"q0","query":"SELECT 1","db_id":"toy"},
                        {"question":"q1","query":7,"db_id":"toy"}]"#;
        let dir = write_root(train, "[]");
        let err = SpiderDataset::load(dir.path()).unwrap_err();
        match &err {
            SpiderError::Field {
                path,
                index,
                message,
            } => {
                assert!(path.ends_with(TRAIN_FILE));
                assert_eq!(*index, 1);
                assert!(message.contains("query"), "{message}");
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(err.to_string().contains(TRAIN_FILE));
    }

    #[test]
    fn missing_field_is_an_error() {
        let dir = write_root("[]", r#"[{"question":"q","db_id":"toy"}]"#);
        let err = SpiderDataset::load(dir.path()).unwrap_err();
        assert!(
            matches!(&err, SpiderError::Field { index: 0, message, .. } if message.contains("missing field `query`")),
            "{err}"
        );
    }

    #[test]
    fn top_level_object_is_rejected() {
        let dir = write_root("{}", "[]");
        let err = SpiderDataset::load(dir.path()).unwrap_err();
        assert!(matches!(err, SpiderError::Json { .. }), "{err}");
    }

    #[test]
    fn path_like_db_ids_are_never_present() {
        assert!(is_plain_db_id("concert_singer"));
        assert!(!is_plain_db_id("../toy"));
        assert!(!is_plain_db_id(".."));
        assert!(!is_plain_db_id(""));
    }

    #[test]
    fn split_serialises_lowercase() {
        assert_eq!(serde_json::to_string(&Split::Train).unwrap(), "\"train\"");
        assert_eq!(Split::Dev.to_string(), "dev");
    }
}
