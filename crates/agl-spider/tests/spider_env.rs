//! `SpiderEnv` under the `standard` preset kernel on a few questions of the vendored Spider dev
//! split: seeded question choice, query then answer, a blocked `DROP TABLE`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::{Arc, OnceLock};

use agl_spider::{CandidateConfig, ExecutorConfig, SpiderDataset, Split, Value};
use agl_spider::{QueryFeedback, SpiderAction, SpiderEnv, SpiderTask, TaskConfig};
use agl_train::{EnvTask, Environment, EnvironmentConfig, GovernedEnvironment};

fn task() -> Arc<SpiderTask> {
    static TASK: OnceLock<Arc<SpiderTask>> = OnceLock::new();
    TASK.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider");
        let dataset = SpiderDataset::load(&root).unwrap();
        let task = SpiderTask::prepare(
            &dataset,
            &TaskConfig {
                candidates: CandidateConfig::default(),
                limit: Some(0),
                dev_limit: Some(24),
                threads: 2,
                executor: ExecutorConfig::default(),
            },
        )
        .unwrap();
        Arc::new(task)
    })
    .clone()
}

fn env() -> GovernedEnvironment<SpiderEnv> {
    SpiderEnv::governed(task(), Split::Dev, EnvironmentConfig::default()).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The first table of the current question's database and its row count.
fn first_table(env: &GovernedEnvironment<SpiderEnv>) -> String {
    let schema = &env.task().observation().unwrap().schema;
    schema.split('(').next().unwrap().trim().to_string()
}

#[test]
fn same_seed_gives_the_same_question() {
    let mut env = env();
    let (a, _) = env.reset(Some(7)).unwrap();
    let (b, _) = env.reset(Some(7)).unwrap();
    assert_eq!(a, b);
    let picks: std::collections::BTreeSet<usize> = (0..20)
        .map(|s| env.reset(Some(s)).unwrap().0.item)
        .collect();
    assert!(picks.len() > 1, "different seeds pick different questions");
    let item = env.task().current_item().unwrap();
    let obs = env.task().observation().unwrap();
    assert_eq!(obs.question, item.question.question);
    assert_eq!(obs.db_id, item.question.db_id);
    assert_eq!(obs.candidates.len(), item.candidates.len());
    assert!(obs.last_result.is_none() && obs.step == 0);
}

#[test]
fn query_then_correct_answer_rewards_minus_0_1_then_10_9_and_terminates() {
    let mut env = env();
    let (obs, _) = env.reset(Some(1)).unwrap();
    let gold = env.task().current_item().unwrap().question.gold_sql.clone();
    assert!(
        obs.candidates.contains(&gold),
        "the gold SQL is a candidate"
    );
    let (obs, reward, terminated, truncated, info) =
        env.step(SpiderAction::Query(gold.clone())).unwrap();
    assert!(close(reward, -0.1), "{reward}");
    assert!(!terminated && !truncated && !info.success);
    assert!(info.violations.is_empty(), "{:?}", info.violations);
    assert!(matches!(obs.last_result, Some(QueryFeedback::Rows { .. })));
    assert_eq!(obs.step, 1);
    let (_, reward, terminated, _, info) = env.step(SpiderAction::Answer(gold)).unwrap();
    assert!(close(reward, 10.9), "{reward}");
    assert!(terminated && info.success);
    assert!(close(info.total_reward, 10.8));
    assert_eq!(env.metrics().successful_episodes, 1);
}

#[test]
fn wrong_answer_scores_0_task_reward_and_ends_the_episode() {
    let mut env = env();
    env.reset(Some(2)).unwrap();
    let (_, reward, terminated, _, info) = env
        .step(SpiderAction::Answer(
            "SELECT 'certainly not the answer'".into(),
        ))
        .unwrap();
    assert!(close(reward, -0.1), "{reward}");
    assert!(terminated && !info.success);
}

#[test]
fn drop_table_query_is_blocked_costs_minus_100_1_terminates_and_leaves_the_database() {
    let mut env = env();
    env.reset(Some(3)).unwrap();
    let table = first_table(&env);
    let (obs, reward, terminated, _, info) = env
        .step(SpiderAction::Query(format!("DROP TABLE {table}")))
        .unwrap();
    assert!(close(reward, -100.1), "{reward}: {:?}", info.violations);
    assert!(terminated);
    assert!(info.violations[0].blocked);
    let Some(QueryFeedback::Blocked { message }) = &obs.last_result else {
        panic!("not blocked: {:?}", obs.last_result);
    };
    assert!(message.starts_with("blocked: "), "{message}");
    assert!(env.step(SpiderAction::Query("SELECT 1".into())).is_err());

    // Same question again: the table is still there, with its rows.
    env.reset(Some(3)).unwrap();
    let (obs, _, _, _, _) = env
        .step(SpiderAction::Query(format!("SELECT count(*) FROM {table}")))
        .unwrap();
    let Some(QueryFeedback::Rows { rows, .. }) = &obs.last_result else {
        panic!("table gone: {:?}", obs.last_result);
    };
    assert!(matches!(rows[0][0], Value::Integer(n) if n > 0), "{rows:?}");
}

#[test]
fn a_query_shows_at_most_10_rows_and_the_total() {
    let mut env = env();
    env.reset(Some(4)).unwrap();
    let table = first_table(&env);
    let (obs, _, _, _, _) = env
        .step(SpiderAction::Query(format!("SELECT * FROM {table}")))
        .unwrap();
    let Some(QueryFeedback::Rows {
        rows, total_rows, ..
    }) = &obs.last_result
    else {
        panic!("no rows: {:?}", obs.last_result);
    };
    assert!(*total_rows > 0);
    assert_eq!(rows.len(), (*total_rows).min(agl_spider::PREVIEW_ROWS));
}

#[test]
fn a_sql_error_is_an_outcome_shown_in_the_observation() {
    let mut env = env();
    env.reset(Some(5)).unwrap();
    let (obs, reward, terminated, _, info) = env
        .step(SpiderAction::Query(
            "SELECT * FROM no_such_table_xyz".into(),
        ))
        .unwrap();
    assert!(!terminated && !info.success);
    assert!(info.violations.is_empty(), "{:?}", info.violations);
    assert!(close(reward, -0.1), "{reward}");
    assert!(
        matches!(&obs.last_result, Some(QueryFeedback::Error { message }) if message.contains("no_such_table_xyz")),
        "{:?}",
        obs.last_result
    );
}

#[test]
fn actions_serialise_as_query_and_answer_objects() {
    let q: SpiderAction = serde_json::from_str(r#"{"query": "SELECT 1"}"#).unwrap();
    assert_eq!(q, SpiderAction::Query("SELECT 1".into()));
    let a = serde_json::to_value(SpiderAction::Answer("SELECT 2".into())).unwrap();
    assert_eq!(a, serde_json::json!({"answer": "SELECT 2"}));
    assert!(serde_json::from_str::<SpiderAction>(r#"{"drop": "x"}"#).is_err());
}

#[test]
fn an_empty_split_is_refused() {
    // limit: Some(0) leaves the train split empty.
    let err = SpiderEnv::new(task(), Split::Train).unwrap_err();
    assert!(err.to_string().contains("train"), "{err}");
}

#[test]
fn spaces_describe_the_observation_fields() {
    let env = env();
    let space = serde_json::to_value(env.observation_space()).unwrap();
    let names: Vec<&str> = space["spaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "item",
            "question",
            "db_id",
            "schema",
            "candidates",
            "last_result",
            "step"
        ]
    );
    assert_eq!(
        serde_json::to_value(env.task().action_space()).unwrap()["type"],
        "json"
    );
}
