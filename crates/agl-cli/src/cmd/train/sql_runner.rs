//! `--runner sql`: the built-in Spider SQL agent ([`agl_spider::LlmSqlAgent`]) as the agent of
//! `agl train --algorithm`, in this process: `--workers` [`agl_train::InProcessRunners`]
//! serving the store's queue, each rollout's statements checked by the training mode's kernel
//! (with the tables' row counts of `--data`), its reward the execution match of
//! `--task-reward` shaped by the mode's `PolicyReward` on the runner side.
//!
//! Tasks are lines of `agl spider tasks` (or serialised questions), turned into the agent's
//! input ([`crate::spider_task::task_question`]) before they are enqueued; the databases are
//! those of `--data`. The agent reads its LLM from the `--llm-resource` resource and its write
//! prompt's user message from the `prompt_template` resource when there is one (APO).
//!
//! Responsible for that wiring; not for the agent (`agl-spider`) or the runners (`agl-train`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agl_gov::{BuildEnv, PolicyFile};
use agl_spider::{ExecutorConfig, LlmSqlAgent, Question, SpiderDataset, SqlAgentConfig};
use agl_train::{InProcessRunners, RewardConfig, RunnerPool, TrainingMode};
use anyhow::{Context, bail};
use serde_json::Value;

use super::any::RunnerSpec;
use super::llm::{LlmTrainArgs, SharedArgs};

/// The tasks of `flag` as the agent's questions (JSON), checked against `dataset`: the error
/// names the task (1-based) and what is wrong with it.
fn questions(tasks: &[Value], flag: &str, dataset: &SpiderDataset) -> anyhow::Result<Vec<Value>> {
    tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let q = crate::spider_task::task_question(t)
                .map_err(|e| anyhow::anyhow!("{flag}: task {}: {e}", i + 1))?;
            if !dataset.db_path(&q.db_id).is_file() {
                bail!(
                    "{flag}: task {}: no database `{}` under {} (--data)",
                    i + 1,
                    q.db_id,
                    dataset.root.display()
                );
            }
            serde_json::to_value(&q).context("serialising a question")
        })
        .collect()
}

/// For `--runner sql`: loads `--data` and turns the train and validation tasks into the agent's
/// questions in place; `None` (and the tasks untouched) for the other runners.
pub fn prepare(
    runner: &RunnerSpec,
    data: &Path,
    train: &mut Vec<Value>,
    val: &mut Vec<Value>,
) -> anyhow::Result<Option<SpiderDataset>> {
    if *runner != RunnerSpec::Sql {
        return Ok(None);
    }
    let dataset = dataset(data)?;
    *train = questions(train, "--train-dataset", &dataset)?;
    *val = questions(val, "--val-dataset", &dataset)?;
    Ok(Some(dataset))
}

/// Loads `--data` for the sql runner, naming the flag when it is not there.
fn dataset(data: &Path) -> anyhow::Result<SpiderDataset> {
    if !data.is_dir() {
        bail!(
            "--runner sql: data directory {} does not exist (pass --data DIR)",
            data.display()
        );
    }
    SpiderDataset::load(data)
        .with_context(|| format!("--runner sql: loading Spider data from {}", data.display()))
}

/// The pool of `--runner sql` for one training mode. `tasks` are the questions it will run
/// (their tables' row counts go to the kernel).
pub fn pool(
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    llm_resource: &str,
    mode: TrainingMode,
    dataset: &SpiderDataset,
    tasks: &[&[Value]],
) -> anyhow::Result<Box<dyn RunnerPool>> {
    let qs: Vec<Question> = tasks
        .iter()
        .flat_map(|t| t.iter())
        .map(|v| serde_json::from_value(v.clone()))
        .collect::<Result<_, _>>()
        .context("reading the questions back")?;
    let stats = crate::kernel::table_stats(dataset, qs.iter())?;
    let policy = PolicyFile::resolve(&shared.policy)
        .with_context(|| format!("--policy {}", shared.policy))?;
    let kernel = crate::kernel::build_kernel(
        &policy,
        &BuildEnv {
            table_stats: stats,
            mode: Some(mode.kernel_mode()),
            check_cache: Some(Arc::new(agl_gov::CheckCache::default())),
        },
        None,
    )
    .with_context(|| format!("--policy {}", shared.policy))?;
    let agent = LlmSqlAgent::new(
        dataset.root.join(agl_spider::DATABASE_DIR),
        SqlAgentConfig {
            max_turns: args.max_turns,
            check: args.check,
            max_tokens: args.max_tokens,
            temperature: 0.0,
            request_timeout: Duration::from_secs_f64(args.request_timeout),
            llm_resource: Some(llm_resource.to_string()),
            executor: ExecutorConfig {
                timeout: Duration::from_secs_f64(shared.sql_timeout),
            },
        },
    )?;
    let reward = agl_spider::sql_agent_reward(RewardConfig::default(), args.task_reward)
        .with_shaping(mode.shapes_reward());
    Ok(Box::new(
        InProcessRunners::new(Arc::new(kernel), Arc::new(agent)).with_reward(Arc::new(reward)),
    ))
}
