//! Loader tests against the vendored `data/spider` copy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use agl_spider::{DEV_FILE, SpiderDataset, SpiderError, Split, TRAIN_FILE, db_info};

fn data_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

#[test]
fn vendored_counts_match_source_md() {
    let ds = SpiderDataset::load(&data_root()).unwrap();
    assert_eq!(ds.train.len(), 6904);
    assert_eq!(ds.train_skipped.total(), 96);
    assert_eq!(ds.train_skipped.missing_db.get("baseball_1"), Some(&82));
    assert_eq!(ds.train_skipped.missing_db.get("soccer_1"), Some(&14));
    assert_eq!(ds.train_skipped.missing_db.len(), 2);
    assert_eq!(ds.dev.len(), 972);
    assert_eq!(ds.dev_skipped.total(), 62);
    assert_eq!(ds.dev_skipped.missing_db.get("wta_1"), Some(&62));
    assert_eq!(ds.dev_skipped.missing_db.len(), 1);

    let dev_dbs = ds.database_ids(Split::Dev);
    assert_eq!(dev_dbs.len(), 19);
    assert!(
        dev_dbs.windows(2).all(|w| w[0] < w[1]),
        "sorted and distinct"
    );
    assert!(!dev_dbs.iter().any(|d| d == "wta_1"));
    assert_eq!(ds.database_ids(Split::Train).len(), 138);
    for db in &dev_dbs {
        assert!(ds.db_path(db).is_file(), "{db}");
    }
    assert!(!ds.db_path("wta_1").exists());
}

#[test]
fn questions_keep_file_order_and_fields() {
    let ds = SpiderDataset::load(&data_root()).unwrap();
    let first = &ds.dev[0];
    assert_eq!(first.split, Split::Dev);
    assert_eq!(first.index, 0);
    assert_eq!(first.db_id, "concert_singer");
    assert_eq!(first.question, "How many singers do we have?");
    assert_eq!(first.gold_sql, "SELECT count(*) FROM singer");
    assert!(ds.dev.windows(2).all(|w| w[0].index < w[1].index));
    let t0 = &ds.train[0];
    assert_eq!(t0.split, Split::Train);
    assert_eq!(t0.gold_sql, "SELECT count(*) FROM head WHERE age  >  56");
    // Skipped questions still take their index: indices run past the kept count.
    assert!(ds.dev.last().unwrap().index >= 972);
}

#[test]
fn db_info_reads_real_schema() {
    let ds = SpiderDataset::load(&data_root()).unwrap();
    let info = db_info("concert_singer", &ds.db_path("concert_singer")).unwrap();
    let names: Vec<_> = info.tables.iter().map(|t| t.name.to_lowercase()).collect();
    for t in ["stadium", "singer", "concert", "singer_in_concert"] {
        assert!(names.contains(&t.to_string()), "{t} in {names:?}");
    }
    assert_eq!(info.row_counts().get("singer"), Some(&6));
    let singer = info
        .tables
        .iter()
        .find(|t| t.name.eq_ignore_ascii_case("singer"))
        .unwrap();
    assert!(
        singer
            .columns
            .iter()
            .any(|c| c.eq_ignore_ascii_case("name"))
    );
}

#[test]
fn missing_dir_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no_such_dir");
    let err = SpiderDataset::load(&missing).unwrap_err();
    assert!(
        matches!(&err, SpiderError::MissingDir { path } if path == &missing),
        "{err}"
    );
    assert!(err.to_string().contains("no_such_dir"));
}

#[test]
fn missing_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("database")).unwrap();
    std::fs::copy(data_root().join(TRAIN_FILE), dir.path().join(TRAIN_FILE)).unwrap();
    let err = SpiderDataset::load(dir.path()).unwrap_err();
    assert!(matches!(err, SpiderError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains(DEV_FILE), "{err}");
}

#[test]
fn truncated_json_names_the_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("database")).unwrap();
    std::fs::copy(data_root().join(TRAIN_FILE), dir.path().join(TRAIN_FILE)).unwrap();
    let dev = std::fs::read(data_root().join(DEV_FILE)).unwrap();
    std::fs::write(dir.path().join(DEV_FILE), &dev[..dev.len() / 2]).unwrap();
    let err = SpiderDataset::load(dir.path()).unwrap_err();
    match &err {
        SpiderError::Json {
            path, line, column, ..
        } => {
            assert!(path.ends_with(DEV_FILE));
            assert!(*line > 1 && *column > 0, "line {line} column {column}");
        }
        other => panic!("expected a JSON error, got {other:?}"),
    }
    assert!(err.to_string().contains(DEV_FILE), "{err}");
}

#[test]
fn the_default_write_template_renders_every_dev_prompt_byte_identical() {
    use agl_spider::prompts::{
        WRITE_USER_TEMPLATE, render_schema, write_messages, write_messages_with,
    };
    let ds = SpiderDataset::load(&data_root()).unwrap();
    let template = agl_core::FStringTemplate::parse(WRITE_USER_TEMPLATE).unwrap();
    let mut schemas = std::collections::HashMap::new();
    for q in &ds.dev {
        let schema = schemas
            .entry(q.db_id.clone())
            .or_insert_with(|| render_schema(&db_info(&q.db_id, &ds.db_path(&q.db_id)).unwrap()));
        assert_eq!(
            write_messages_with(&template, schema, &q.question).unwrap(),
            write_messages(schema, &q.question),
            "{}",
            q.question
        );
    }
    assert_eq!(ds.dev.len(), 972);
}
