//! The executor's safety contract on real Spider databases: unsafe SQL is reported, rolled
//! back, and never touches the files under `data/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use agl_spider::{
    CandidateBuilder, CandidateConfig, CandidateKind, DbInfo, Executor, ExecutorConfig, Question,
    SpiderDataset, SpiderError, Value, db_info,
};
use sha2::{Digest, Sha256};

const DBS: [&str; 6] = [
    "concert_singer",
    "pets_1",
    "world_1",
    "car_1",
    "dog_kennels",
    "flight_2",
];

fn data_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

/// sha256 of every file under `dir`, keyed by path.
fn hash_tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.insert(p, hex::encode(Sha256::digest(&bytes)));
            }
        }
    }
    out
}

fn journal_files(dir: &Path) -> Vec<PathBuf> {
    hash_tree(dir)
        .into_keys()
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with("-journal") || name.ends_with("-wal") || name.ends_with("-shm")
        })
        .collect()
}

fn count_rows(ex: &mut Executor, db: &str, table: &str) -> i64 {
    let e = ex
        .execute(db, &format!("SELECT count(*) FROM \"{table}\""))
        .unwrap();
    match e.result.rows[0][0] {
        Value::Integer(n) => n,
        ref other => panic!("count(*) returned {other:?}"),
    }
}

#[test]
fn unsafe_sql_never_changes_the_data_directory() {
    let root = data_root();
    let db_dir = root.join("database");
    let ds = SpiderDataset::load(&root).unwrap();
    let before_all = hash_tree(&db_dir);
    let before: Vec<_> = DBS.iter().map(|db| hash_tree(&db_dir.join(db))).collect();
    assert!(before.iter().all(|h| !h.is_empty()));

    let infos: HashMap<String, DbInfo> = DBS
        .iter()
        .map(|db| (db.to_string(), db_info(db, &ds.db_path(db)).unwrap()))
        .collect();
    let mut ex = Executor::new(db_dir.clone(), ExecutorConfig::default());
    let attach_dir = tempfile::tempdir().unwrap();
    let attach_target = attach_dir.path().join("x.db");

    for db in DBS {
        let info = &infos[db];
        let original: Vec<(String, i64)> = info
            .tables
            .iter()
            .map(|t| (t.name.clone(), i64::try_from(t.rows).unwrap()))
            .collect();

        // Every unsafe candidate kind, for a few questions of this database.
        let questions: Vec<Question> = ds
            .dev
            .iter()
            .filter(|q| q.db_id == db)
            .take(4)
            .cloned()
            .collect();
        assert!(!questions.is_empty(), "{db}");
        let config = CandidateConfig {
            distractors: 0,
            ..CandidateConfig::default()
        };
        let builder = CandidateBuilder::new(&questions, &infos, config);
        for i in 0..questions.len() {
            let set = builder.build(i);
            let kinds: Vec<_> = set
                .iter()
                .map(|c| c.kind)
                .filter(|k| k.is_unsafe())
                .collect();
            assert_eq!(
                kinds.len(),
                5,
                "{db} question {i}: all unsafe kinds, got {kinds:?}"
            );
            for c in set.iter().filter(|c| c.kind.is_unsafe()) {
                let result = ex.execute(db, &c.sql);
                match c.kind {
                    CandidateKind::CartesianGuard => {
                        let e = result.unwrap();
                        assert!(!e.destructive(), "{}", c.sql);
                    }
                    CandidateKind::DropTable => {
                        let e = result.unwrap();
                        assert!(e.schema_changed && e.destructive(), "{}", c.sql);
                    }
                    CandidateKind::StackedWrite | CandidateKind::DeleteWhere => {
                        let e = result.unwrap();
                        // The vendored dev databases' target tables are non-empty.
                        assert!(e.rows_changed > 0 && !e.schema_changed, "{}", c.sql);
                    }
                    CandidateKind::UpdateNoWhere => match result {
                        Ok(e) => assert!(e.rows_changed > 0, "{}", c.sql),
                        // A NOT NULL / primary-key column refuses the update: nothing changed.
                        Err(SpiderError::Sql { message, .. }) => {
                            assert!(
                                message.contains("constraint") || message.contains("mismatch"),
                                "{message}"
                            )
                        }
                        Err(other) => panic!("{}: {other}", c.sql),
                    },
                    CandidateKind::Gold | CandidateKind::Distractor => unreachable!(),
                }
            }
        }

        // Raw destructive statements on the largest table.
        let big = info.largest_table().unwrap();
        let t = format!("\"{}\"", big.name);
        let col = format!("\"{}\"", big.columns[0]);
        let e = ex.execute(db, &format!("DROP TABLE {t}")).unwrap();
        assert!(e.schema_changed && e.rows_changed == 0);
        let e = ex.execute(db, &format!("DELETE FROM {t}")).unwrap();
        assert_eq!(e.rows_changed, big.rows);
        assert!(!e.schema_changed);
        let e = ex
            .execute(db, &format!("UPDATE {t} SET {col} = {col}"))
            .unwrap();
        assert_eq!(e.rows_changed, big.rows);
        let e = ex
            .execute(
                db,
                "CREATE TABLE agl_probe(a); INSERT INTO agl_probe VALUES (1), (2)",
            )
            .unwrap();
        assert!(e.schema_changed);
        assert_eq!(e.rows_changed, 2);
        assert_eq!(e.statements, 2);
        let e = ex
            .execute(db, &format!("INSERT INTO {t} SELECT * FROM {t} WHERE 0"))
            .unwrap();
        assert!(!e.destructive());
        let e = ex.execute(db, "CREATE INDEX agl_idx ON agl_nothing(a)");
        assert!(matches!(e, Err(SpiderError::Sql { .. })));

        // Statements that try to reach outside the in-memory copy are refused.
        let attach = format!("ATTACH DATABASE '{}' AS x", attach_target.display());
        assert!(
            matches!(ex.execute(db, &attach), Err(SpiderError::Sql { .. })),
            "{attach}"
        );
        assert!(
            !attach_target.exists(),
            "ATTACH must not create {}",
            attach_target.display()
        );
        let vacuum_target = attach_dir.path().join("vacuum.db");
        let vacuum_into = format!("VACUUM INTO '{}'", vacuum_target.display());
        assert!(matches!(
            ex.execute(db, &vacuum_into),
            Err(SpiderError::Sql { .. })
        ));
        assert!(!vacuum_target.exists(), "VACUUM INTO must not write a file");
        for sql in [
            "PRAGMA journal_mode=WAL",
            "VACUUM",
            "COMMIT",
            "DETACH DATABASE main",
        ] {
            assert!(
                matches!(ex.execute(db, sql), Err(SpiderError::Sql { .. })),
                "{sql}"
            );
        }

        // The in-memory copy is unchanged after all of that.
        for (name, rows) in &original {
            assert_eq!(count_rows(&mut ex, db, name), *rows, "{db}.{name}");
        }
        let e = ex
            .execute(db, "SELECT name FROM sqlite_master WHERE name LIKE 'agl_%'")
            .unwrap();
        assert_eq!(
            e.rows_returned, 0,
            "{db}: probe objects must be rolled back"
        );
    }

    // The files are byte-identical and no journal files appeared.
    for (db, hashes) in DBS.iter().zip(&before) {
        assert_eq!(&hash_tree(&db_dir.join(db)), hashes, "{db} changed on disk");
    }
    assert_eq!(hash_tree(&db_dir), before_all, "the data directory changed");
    assert!(
        journal_files(&db_dir).is_empty(),
        "{:?}",
        journal_files(&db_dir)
    );
}

#[test]
fn a_fresh_executor_sees_the_original_data() {
    let db_dir = data_root().join("database");
    let mut a = Executor::new(db_dir.clone(), ExecutorConfig::default());
    let before = count_rows(&mut a, "pets_1", "Student");
    let e = a
        .execute("pets_1", "DELETE FROM Student; DROP TABLE Pets")
        .unwrap();
    assert!(e.destructive());
    let mut b = Executor::new(db_dir, ExecutorConfig::default());
    assert_eq!(count_rows(&mut b, "pets_1", "Student"), before);
    assert_eq!(count_rows(&mut a, "pets_1", "Student"), before);
    assert!(count_rows(&mut b, "pets_1", "Pets") > 0);
}

#[test]
fn missing_database_is_reported() {
    let mut ex = Executor::new(data_root().join("database"), ExecutorConfig::default());
    let err = ex.execute("wta_1", "SELECT 1").unwrap_err();
    match err {
        SpiderError::MissingDatabase { db_id, path } => {
            assert_eq!(db_id, "wta_1");
            assert!(path.ends_with("wta_1/wta_1.sqlite"));
            assert!(!path.exists());
        }
        other => panic!("{other}"),
    }
}
