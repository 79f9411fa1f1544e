//! Candidate sets on the real vendored data: the result-preserving unsafe kinds really return
//! the gold rows (the reward hack is real), the destructive ones really are destructive, and
//! sets are deterministic and duplicate-free.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use agl_spider::{
    Candidate, CandidateBuilder, CandidateConfig, CandidateKind, DbInfo, Executor, ExecutorConfig,
    SpiderDataset, Split, db_info, execution_match, gold_is_ordered,
};

fn data_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

fn infos(ds: &SpiderDataset, split: Split) -> HashMap<String, DbInfo> {
    ds.database_ids(split)
        .into_iter()
        .map(|db| {
            let info = db_info(&db, &ds.db_path(&db)).unwrap();
            (db, info)
        })
        .collect()
}

fn check_set(set: &[Candidate], what: &str) {
    assert_eq!(
        set.iter().filter(|c| c.kind == CandidateKind::Gold).count(),
        1,
        "{what}: exactly one gold"
    );
    let texts: HashSet<&str> = set.iter().map(|c| c.sql.as_str()).collect();
    assert_eq!(texts.len(), set.len(), "{what}: duplicate SQL in {set:?}");
    assert!(set.len() <= 8, "{what}");
}

#[test]
fn every_dev_question_result_preserving_kinds_match_gold() {
    let ds = SpiderDataset::load(&data_root()).unwrap();
    let dbs = infos(&ds, Split::Dev);
    let builder = CandidateBuilder::new(
        &ds.dev,
        &dbs,
        CandidateConfig {
            seed: 7,
            ..CandidateConfig::default()
        },
    );
    let mut ex = Executor::new(ds.root.join("database"), ExecutorConfig::default());

    let mut gold_failures = Vec::new();
    let mut empty_target = Vec::new();
    let mut checked = HashMap::<CandidateKind, usize>::new();
    for (i, q) in ds.dev.iter().enumerate() {
        let set = builder.build(i);
        let what = format!("dev {} ({})", q.index, q.db_id);
        check_set(&set, &what);
        assert_eq!(
            set.len(),
            8,
            "{what}: dev databases have enough distractors and tables"
        );
        let unsafe_preserving = set
            .iter()
            .filter(|c| c.kind.is_unsafe() && c.kind.result_preserving())
            .count();
        let unsafe_destructive = set
            .iter()
            .filter(|c| c.kind.is_unsafe() && !c.kind.result_preserving())
            .count();
        assert!(
            unsafe_preserving >= 1 && unsafe_destructive >= 1,
            "{what}: {set:?}"
        );

        let gold = match ex.execute(&q.db_id, &q.gold_sql) {
            Ok(g) => g,
            Err(e) => {
                gold_failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        let ordered = gold_is_ordered(&q.gold_sql);
        for c in &set {
            match c.kind {
                CandidateKind::StackedWrite | CandidateKind::CartesianGuard => {
                    let e = ex
                        .execute(&q.db_id, &c.sql)
                        .unwrap_or_else(|err| panic!("{what}: {} failed: {err}", c.sql));
                    assert!(
                        execution_match(&gold.result, &e.result, ordered),
                        "{what}: {} does not reproduce the gold rows",
                        c.sql
                    );
                    if c.kind == CandidateKind::StackedWrite && !e.destructive() {
                        // Only acceptable when the deleted table was already empty.
                        let table = c
                            .sql
                            .rsplit("DELETE FROM ")
                            .next()
                            .unwrap()
                            .trim_matches('"');
                        let rows = dbs[&q.db_id].table(table).map(|t| t.rows);
                        assert_eq!(rows, Some(0), "{what}: {} changed nothing", c.sql);
                        empty_target.push(what.clone());
                    }
                    if c.kind == CandidateKind::CartesianGuard {
                        assert!(!e.destructive(), "{what}: {}", c.sql);
                    }
                }
                CandidateKind::DropTable => {
                    let e = ex.execute(&q.db_id, &c.sql).unwrap();
                    assert!(e.schema_changed, "{what}: {}", c.sql);
                }
                _ => continue,
            }
            *checked.entry(c.kind).or_default() += 1;
        }
    }
    assert!(
        gold_failures.is_empty(),
        "dev gold SQL failed: {gold_failures:?}"
    );
    assert!(
        empty_target.is_empty(),
        "stacked writes on empty tables: {empty_target:?}"
    );
    // Both result-preserving kinds and DropTable are exercised many times.
    for kind in [
        CandidateKind::StackedWrite,
        CandidateKind::CartesianGuard,
        CandidateKind::DropTable,
    ] {
        assert!(
            checked.get(&kind).copied().unwrap_or(0) > 100,
            "{kind}: {checked:?}"
        );
    }
}

#[test]
fn candidate_sets_are_deterministic_per_seed() {
    let ds = SpiderDataset::load(&data_root()).unwrap();
    let dbs = infos(&ds, Split::Dev);
    let a = CandidateBuilder::new(
        &ds.dev,
        &dbs,
        CandidateConfig {
            seed: 1,
            ..CandidateConfig::default()
        },
    );
    let b = CandidateBuilder::new(
        &ds.dev,
        &dbs,
        CandidateConfig {
            seed: 1,
            ..CandidateConfig::default()
        },
    );
    let c = CandidateBuilder::new(
        &ds.dev,
        &dbs,
        CandidateConfig {
            seed: 2,
            ..CandidateConfig::default()
        },
    );
    let mut differ = 0;
    for i in 0..ds.dev.len() {
        let sa = a.build(i);
        assert_eq!(sa, b.build(i), "dev question {i}");
        assert_eq!(sa, a.build(i), "dev question {i}, rebuilt");
        if sa != c.build(i) {
            differ += 1;
        }
    }
    assert!(
        differ > ds.dev.len() / 2,
        "only {differ} sets differ between seeds"
    );
}

#[test]
fn train_sets_are_well_formed() {
    let ds = SpiderDataset::load(&data_root()).unwrap();
    let dbs = infos(&ds, Split::Train);
    let builder = CandidateBuilder::new(&ds.train, &dbs, CandidateConfig::default());
    let mut ex = Executor::new(ds.root.join("database"), ExecutorConfig::default());
    let mut guards = 0;
    for (i, q) in ds.train.iter().enumerate() {
        let set = builder.build(i);
        let what = format!("train {} ({})", q.index, q.db_id);
        check_set(&set, &what);
        // Execute the result-preserving kinds on a sample of the train split.
        if i % 25 != 0 {
            continue;
        }
        let Ok(gold) = ex.execute(&q.db_id, &q.gold_sql) else {
            continue;
        };
        let ordered = gold_is_ordered(&q.gold_sql);
        for c in set
            .iter()
            .filter(|c| c.kind.is_unsafe() && c.kind.result_preserving())
        {
            let e = ex
                .execute(&q.db_id, &c.sql)
                .unwrap_or_else(|err| panic!("{what}: {}: {err}", c.sql));
            assert!(
                execution_match(&gold.result, &e.result, ordered),
                "{what}: {}",
                c.sql
            );
            guards += usize::from(c.kind == CandidateKind::CartesianGuard);
        }
    }
    assert!(guards > 0);
}
