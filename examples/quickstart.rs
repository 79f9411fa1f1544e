//! The quick start of the agentmesh-lightning tutorial (§1), in Rust: a kernel with a SQL
//! policy and a cost policy, a governed runner, a policy-aware reward, and one step on a clean
//! SELECT and one on `DROP TABLE users`.
//!
//! Run it with `cargo run --example quickstart`. The agent executes SQL against an in-memory
//! SQLite database, but only what the kernel lets through: the DROP is blocked before it
//! runs (the table is still there afterwards), so its rollout is a failure with base reward 0
//! and penalty 100, reward −100. (The Python tutorial's mock kernel reports −99 because it
//! counts the blocked action as a success.)

use std::sync::{Arc, Mutex};

use agl_gov::{
    ActionKind, CostConfig, CostControlPolicy, GovernanceMode, Kernel, PolicyOptions, SqlPolicy,
    SqlPolicyConfig, TableStats,
};
use agl_train::{
    Agent, AgentError, GovernedRollout, GovernedRunner, PolicyReward, RewardConfig, StepContext,
};

/// What the agent returns: the rows and how good they are (here: any answer is accurate).
struct Answer {
    rows: Vec<Vec<String>>,
    accuracy: f64,
}

/// An agent that runs the SQL it is given, after asking the kernel.
struct SqlAgent {
    db: Mutex<rusqlite::Connection>,
}

#[async_trait::async_trait]
impl Agent for SqlAgent {
    type Input = String;
    type Output = Answer;

    async fn run(&self, sql: &String, ctx: &mut StepContext) -> Result<Answer, AgentError> {
        // Ask first: a blocked action returns an error here and never reaches the database.
        let approved = ctx.check(agl_gov::Action::sql("app", sql.as_str()))?;
        let ActionKind::Sql { sql, .. } = approved.action.kind else {
            return Err("the kernel approved something other than SQL".into());
        };
        let db = self.db.lock().map_err(|_| "database lock poisoned")?;
        let mut stmt = db.prepare(&sql)?;
        let width = stmt.column_count();
        let rows = stmt
            .query_map([], |row| {
                (0..width)
                    .map(|i| row.get::<_, rusqlite::types::Value>(i).map(show))
                    .collect::<Result<Vec<_>, _>>()
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Answer {
            rows,
            accuracy: 1.0,
        })
    }
}

/// A SQLite value as plain text.
fn show(value: rusqlite::types::Value) -> String {
    use rusqlite::types::Value;
    match value {
        Value::Null => "NULL".into(),
        Value::Integer(i) => i.to_string(),
        Value::Real(r) => r.to_string(),
        Value::Text(t) => t,
        Value::Blob(b) => format!("<{} bytes>", b.len()),
    }
}

fn named(name: &str) -> PolicyOptions {
    PolicyOptions {
        name: Some(name.to_string()),
        ..PolicyOptions::default()
    }
}

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_target(false)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .without_time()
        .init();
    let db = rusqlite::Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
         INSERT INTO users VALUES (42, 'Ada'), (43, 'Grace');",
    )?;

    // 1. A kernel with two policies: read-only SQL, and at most $100 per action.
    let stats = TableStats::from([("app".into(), [("users".into(), 2u64)].into())]);
    let cost = CostConfig {
        max_cost_usd: 100.0,
        ..CostConfig::default()
    };
    let kernel = Kernel::new(GovernanceMode::Enforce)
        .with_policy_options(
            SqlPolicy::new(SqlPolicyConfig::default()),
            named("SQLPolicy"),
        )
        .with_policy_options(
            CostControlPolicy::new(cost, stats),
            named("CostControlPolicy"),
        );

    // 2. A governed runner.
    let mut runner = GovernedRunner::new(Arc::new(kernel));
    runner.init(SqlAgent { db: Mutex::new(db) });

    // 3. A policy-aware reward: the answer's accuracy if the rollout succeeded, else 0.
    let reward_fn = PolicyReward::new(RewardConfig::default()).with_base_reward(
        |rollout: &GovernedRollout<String, Answer>| match (&rollout.task_output, rollout.success) {
            (Some(answer), true) => answer.accuracy,
            _ => 0.0,
        },
    );

    // 4. Execute tasks and score them.
    for sql in ["SELECT name FROM users WHERE id = 42", "DROP TABLE users"] {
        let rollout = runner.step(sql.to_string(), None).await?;
        let reward = reward_fn.call(&rollout);
        println!("Task: {sql}");
        println!("  Success: {}", rollout.success);
        if let Some(answer) = &rollout.task_output {
            println!("  Rows: {:?}", answer.rows);
        }
        println!("  Violations: {}", rollout.violations.len());
        for v in &rollout.violations {
            println!(
                "    {} [{}, {}]: {}",
                v.policy_name, v.severity, v.violation_type, v.description
            );
        }
        println!("  Penalty: {}", rollout.total_penalty());
        println!("  Reward: {reward}");
    }

    // The DROP never ran: the table is still there.
    let check = runner
        .step("SELECT count(*) FROM users".to_string(), None)
        .await?;
    let rows = check.task_output.map(|a| a.rows).unwrap_or_default();
    println!("After both steps, SELECT count(*) FROM users returns {rows:?}");
    println!(
        "Audit: {} checks in the flight recorder",
        runner.recorder().entries()
    );
    Ok(())
}
