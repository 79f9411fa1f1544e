//! The built-in task, prepared for training: every question with its candidate actions, the
//! gold result to compare against, and the candidates' features.
//!
//! Responsible for turning a loaded [`SpiderDataset`] into [`TaskItem`]s once per process (gold
//! queries are executed here, in the same sandboxed executor the runners use); not for running
//! rollouts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::{
    Candidate, CandidateBuilder, CandidateConfig, DbInfo, Executor, ExecutorConfig, Question,
    ResultSet, SpiderDataset, Split, db_info, gold_is_ordered,
};
use agl_gov::{CheckCache, TableStats};
use serde::Serialize;

use crate::error::SpiderError;
use crate::scorer::features::{SparseFeatures, featurize};

/// One question, ready for rollouts.
pub struct TaskItem {
    /// The Spider question.
    pub question: Question,
    /// Its candidate actions (gold, distractors, unsafe kinds), in a seeded order.
    pub candidates: Vec<Candidate>,
    /// Features of each candidate (same order).
    pub features: Vec<SparseFeatures>,
    /// Result of the gold query.
    pub gold: ResultSet,
    /// Whether the comparison is order-sensitive (the gold query has a top-level ORDER BY).
    pub ordered: bool,
}

/// Counts of what was left out while preparing the task, and why.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PreparationReport {
    /// Train questions used.
    pub train_questions: usize,
    /// Dev questions used.
    pub dev_questions: usize,
    /// Train questions skipped because their database is not in the data directory.
    pub train_missing_database: usize,
    /// Dev questions skipped because their database is not in the data directory.
    pub dev_missing_database: usize,
    /// Questions skipped because their gold query fails to execute (annotation errors upstream).
    pub gold_failed: Vec<String>,
    /// Databases without a database file, with their question counts (train and dev).
    pub missing_databases: Vec<(String, usize)>,
}

/// The prepared task.
pub struct SpiderTask {
    /// Train items.
    pub train: Vec<TaskItem>,
    /// Dev items.
    pub dev: Vec<TaskItem>,
    /// Directory with `<db_id>/<db_id>.sqlite`.
    pub db_root: PathBuf,
    /// Row counts per database and table, for the cost policy.
    pub table_stats: TableStats,
    /// What was left out.
    pub report: PreparationReport,
    /// The check cache every kernel built for this task shares ([`crate::build_kernel`]):
    /// the same statements recur across updates, modes and evaluation.
    pub check_cache: Arc<CheckCache>,
}

/// Options for preparing the task.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// Candidate set composition and seed.
    pub candidates: CandidateConfig,
    /// Use only the first N train questions (after skipping), for quick runs.
    pub limit: Option<usize>,
    /// Use only the first N dev questions.
    pub dev_limit: Option<usize>,
    /// Threads used to execute gold queries.
    pub threads: usize,
    /// Statement time limit.
    pub executor: ExecutorConfig,
}

impl SpiderTask {
    /// Prepares the task from `dataset`.
    pub fn prepare(dataset: &SpiderDataset, config: &TaskConfig) -> Result<Self, SpiderError> {
        let db_root = dataset.root.join("database");
        let mut dbs: HashMap<String, DbInfo> = HashMap::new();
        for split in [Split::Train, Split::Dev] {
            for id in dataset.database_ids(split) {
                if let std::collections::hash_map::Entry::Vacant(slot) = dbs.entry(id) {
                    let info = db_info(slot.key(), &dataset.db_path(slot.key()))?;
                    slot.insert(info);
                }
            }
        }
        let table_stats: TableStats = dbs
            .iter()
            .map(|(k, v)| (k.clone(), v.row_counts()))
            .collect();
        let mut report = PreparationReport {
            train_missing_database: dataset.train_skipped.total(),
            dev_missing_database: dataset.dev_skipped.total(),
            ..PreparationReport::default()
        };
        let mut missing: std::collections::BTreeMap<String, usize> = Default::default();
        for (db, n) in dataset
            .train_skipped
            .missing_db
            .iter()
            .chain(dataset.dev_skipped.missing_db.iter())
        {
            *missing.entry(db.clone()).or_default() += n;
        }
        report.missing_databases = missing.into_iter().collect();

        let train_q = take(&dataset.train, config.limit);
        let dev_q = take(&dataset.dev, config.dev_limit);
        // Distractors come from the whole split, so a --limit run sees the same candidate sets.
        let train = build_items(
            &dataset.train,
            train_q.len(),
            &dbs,
            config,
            &db_root,
            &mut report,
        )?;
        let dev = build_items(
            &dataset.dev,
            dev_q.len(),
            &dbs,
            config,
            &db_root,
            &mut report,
        )?;
        report.train_questions = train.len();
        report.dev_questions = dev.len();
        Ok(Self {
            train,
            dev,
            db_root,
            table_stats,
            report,
            check_cache: Arc::new(CheckCache::default()),
        })
    }

    /// Items of `split`.
    pub fn items(&self, split: Split) -> &[TaskItem] {
        match split {
            Split::Train => &self.train,
            Split::Dev => &self.dev,
        }
    }
}

fn take(qs: &[Question], limit: Option<usize>) -> &[Question] {
    match limit {
        Some(n) => &qs[..n.min(qs.len())],
        None => qs,
    }
}

fn build_items(
    all: &[Question],
    count: usize,
    dbs: &HashMap<String, DbInfo>,
    config: &TaskConfig,
    db_root: &std::path::Path,
    report: &mut PreparationReport,
) -> Result<Vec<TaskItem>, SpiderError> {
    let builder = CandidateBuilder::new(all, dbs, config.candidates);
    let threads = config.threads.max(1);
    let chunk = count.div_ceil(threads).max(1);
    let results: Vec<Result<Vec<Result<TaskItem, String>>, SpiderError>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..count)
                .step_by(chunk)
                .map(|start| {
                    let builder = &builder;
                    s.spawn(
                        move || -> Result<Vec<Result<TaskItem, String>>, SpiderError> {
                            let mut exec = Executor::new(db_root.to_path_buf(), config.executor);
                            let mut out = Vec::new();
                            for (i, q) in all
                                .iter()
                                .enumerate()
                                .take((start + chunk).min(count))
                                .skip(start)
                            {
                                match exec.execute(&q.db_id, &q.gold_sql) {
                                    Ok(gold) => {
                                        let candidates = builder.build(i);
                                        let features = candidates
                                            .iter()
                                            .map(|c| featurize(&q.question, &c.sql))
                                            .collect();
                                        out.push(Ok(TaskItem {
                                            question: q.clone(),
                                            candidates,
                                            features,
                                            gold: gold.result,
                                            ordered: gold_is_ordered(&q.gold_sql),
                                        }));
                                    }
                                    Err(e) => out.push(Err(format!(
                                        "{} #{} ({}): {e}",
                                        q.split, q.index, q.db_id
                                    ))),
                                }
                            }
                            Ok(out)
                        },
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(SpiderError::Worker(
                            "task preparation thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
    let mut items = Vec::with_capacity(count);
    for r in results {
        for item in r? {
            match item {
                Ok(it) => items.push(it),
                Err(msg) => report.gold_failed.push(msg),
            }
        }
    }
    Ok(items)
}
