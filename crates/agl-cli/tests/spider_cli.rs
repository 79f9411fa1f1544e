//! `agl spider tasks` and `agl spider score` through the real binary, on the vendored Spider
//! data: the task lines are agl's own selections with the built-in agent's schema block and
//! prompt; scoring keeps every field, matches by execution and names a bad line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use agl_spider::{Curriculum, SpiderDataset, db_info, prompts};
use common::{agl, assert_one_line_failure};
use serde_json::{Value, json};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

fn lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn tasks_are_agl_selections_with_the_agents_schema_and_prompt() {
    let dataset = SpiderDataset::load(&data()).unwrap();
    let o = agl(&[
        "spider",
        "tasks",
        "--split",
        "train",
        "--limit",
        "5",
        "--messages",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let tasks = lines(&o.stdout);
    let want = agl_spider::train_questions(&dataset, Curriculum::Easy, Some(5), 0);
    assert_eq!(tasks.len(), 5);
    for (t, q) in tasks.iter().zip(&want) {
        assert_eq!(t["id"], format!("train-{}", q.index));
        assert_eq!(t["db_id"], q.db_id.as_str());
        assert_eq!(t["question"], q.question.as_str());
        assert_eq!(t["gold"], q.gold_sql.as_str());
        let path = PathBuf::from(t["db_path"].as_str().unwrap());
        assert!(path.is_absolute() && path.is_file(), "{path:?}");
        let schema = prompts::render_schema(&db_info(&q.db_id, &path).unwrap());
        assert_eq!(t["schema"], schema.as_str());
        let messages = serde_json::to_value(prompts::write_messages(&schema, &q.question)).unwrap();
        assert_eq!(t["messages"], messages);
    }

    // dev: the subset `agl train --eval-limit 4` evaluates; --every: `agl eval --every 200`.
    let o = agl(&["spider", "tasks", "--split", "dev", "--limit", "4"]);
    let ids: Vec<Value> = lines(&o.stdout).iter().map(|t| t["id"].clone()).collect();
    let (dev, _) = agl_spider::dev_questions(&dataset, 4);
    let want: Vec<Value> = dev
        .iter()
        .map(|q| json!(format!("dev-{}", q.index)))
        .collect();
    assert_eq!(ids, want);
    assert!(lines(&o.stdout)[0].get("messages").is_none());
    let o = agl(&[
        "spider", "tasks", "--split", "dev", "--every", "200", "--limit", "3",
    ]);
    let ids: Vec<Value> = lines(&o.stdout).iter().map(|t| t["id"].clone()).collect();
    assert_eq!(
        ids,
        vec![json!("dev-0"), json!("dev-200"), json!("dev-400")]
    );

    // Demonstrations: the write prompt, then the gold SQL in the block the prompt asks for
    // (which the agent's parser reads back as the gold SQL).
    let o = agl(&[
        "spider",
        "tasks",
        "--split",
        "train",
        "--limit",
        "3",
        "--demonstrations",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let demos = lines(&o.stdout);
    let want = agl_spider::train_questions(&dataset, Curriculum::Easy, Some(3), 0);
    assert_eq!(demos.len(), 3);
    for (d, q) in demos.iter().zip(&want) {
        let keys: Vec<&String> = d.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["messages"]);
        let m = d["messages"].as_array().unwrap();
        let path = dataset.db_path(&q.db_id);
        let schema = prompts::render_schema(&db_info(&q.db_id, &path).unwrap());
        let prompt = serde_json::to_value(prompts::write_messages(&schema, &q.question)).unwrap();
        assert_eq!(m[..2], prompt.as_array().unwrap()[..]);
        assert_eq!(m[2]["role"], "assistant");
        let answer = m[2]["content"].as_str().unwrap();
        assert_eq!(prompts::extract_sql(answer).unwrap(), q.gold_sql.trim());
    }

    let o = agl(&["spider", "tasks", "--split", "dev", "--curriculum", "all"]);
    assert_one_line_failure(&o, "apply to --split train only");
    let o = agl(&["spider", "tasks", "--split", "test"]);
    assert_one_line_failure(&o, "unknown split `test`");
}

#[test]
fn score_keeps_every_field_and_matches_by_execution() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("pairs.jsonl");
    let pairs = [
        // Column order and case are free; rows compare as a bag without ORDER BY.
        json!({"id": "a", "db_id": "concert_singer", "gold": "SELECT name, age FROM singer",
               "predicted": "select Age, Name from singer order by age desc"}),
        // With a top-level ORDER BY in the gold query, the order counts.
        json!({"id": "b", "db_id": "concert_singer", "gold": "SELECT name FROM singer ORDER BY age",
               "predicted": "SELECT name FROM singer ORDER BY age DESC"}),
        json!({"id": "c", "db_id": "concert_singer", "gold": "SELECT count(*) FROM singer",
               "predicted": "SELECT count(*) FROM singers"}),
        json!({"id": "d", "db_id": "concert_singer", "gold": "SELECT count(*) FROM singer",
               "predicted": null}),
        // Integers equal integral reals.
        json!({"id": "e", "db_id": "concert_singer", "gold": "SELECT count(*) FROM singer",
               "predicted": "SELECT count(*) * 1.0 FROM singer"}),
    ];
    let text: String = pairs.iter().map(|p| format!("{p}\n\n")).collect();
    std::fs::write(&input, text).unwrap();
    let o = agl(&["spider", "score", "--in", input.to_str().unwrap()]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let out = lines(&o.stdout);
    assert_eq!(out.len(), 5);
    for (got, sent) in out.iter().zip(&pairs) {
        for (k, v) in sent.as_object().unwrap() {
            assert_eq!(&got[k], v, "field {k} kept");
        }
    }
    let matches: Vec<bool> = out.iter().map(|l| l["match"].as_bool().unwrap()).collect();
    assert_eq!(matches, [true, false, false, false, true]);
    assert!(out[0].get("error").is_none());
    assert!(out[2]["error"].as_str().unwrap().contains("no such table"));
    assert_eq!(out[3]["error"], "no predicted SQL");
    assert!(common::stderr(&o).contains("2 match"));

    // A bad line: one line naming the file and line number, nothing printed.
    std::fs::write(
        &input,
        format!(
            "{}\n{{\"db_id\": \"concert_singer\", \"gold\": \"SELECT 1\"}}\n",
            pairs[0]
        ),
    )
    .unwrap();
    let o = agl(&["spider", "score", "--in", input.to_str().unwrap()]);
    assert_one_line_failure(&o, "pairs.jsonl:2: missing field `predicted`");
    assert!(o.stdout.is_empty());
    std::fs::write(
        &input,
        "{\"db_id\": \"no_such_db\", \"gold\": \"x\", \"predicted\": \"y\"}\n",
    )
    .unwrap();
    let o = agl(&["spider", "score", "--in", input.to_str().unwrap()]);
    assert_one_line_failure(&o, "pairs.jsonl:1: unknown database `no_such_db`");
}
