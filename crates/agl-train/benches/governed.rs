//! Throughput of the seed API's hot paths, to compare with the Python baseline of the reference
//! (Part E: 10,000 sequential `step` calls, ~3.0k steps/s with a sqlglot SQL check, ~25–30k
//! `PolicyReward` calls/s with emission):
//! - `runner_step/*`: `GovernedRunner::step` of an agent that checks one SQL statement with a
//!   kernel holding the real `sql_safety` policy (parse, walk, verdict, per-step records, and
//!   the runner's own in-memory flight recorder, since audit is always on);
//! - `policy_reward_call`: `PolicyReward::call` on a rollout with two violations;
//! - `env_step`: `GovernedEnvironment::step` of the kernel-only `ActionTask` (reset every 50
//!   steps).
//!
//! Run: `cargo bench -p agl-train --bench governed`.

use std::hint::black_box;
use std::sync::Arc;

use agl_gov::{Action, GovernanceMode, Kernel, Severity, SqlPolicy, SqlPolicyConfig};
use agl_train::{
    ActionTask, Agent, AgentError, Environment, EnvironmentConfig, GovernedEnvironment,
    GovernedRollout, GovernedRunner, PolicyReward, PolicyViolation, PolicyViolationType,
    RewardConfig, StepContext,
};
use criterion::{Criterion, criterion_group, criterion_main};

struct CheckOnly;

#[async_trait::async_trait]
impl Agent for CheckOnly {
    type Input = &'static str;
    type Output = ();
    async fn run(&self, sql: &&'static str, ctx: &mut StepContext) -> Result<(), AgentError> {
        ctx.check(Action::sql("db", *sql))?;
        Ok(())
    }
}

fn kernel() -> Arc<Kernel> {
    Arc::new(
        Kernel::new(GovernanceMode::Enforce)
            .with_policy(SqlPolicy::new(SqlPolicyConfig::default())),
    )
}

fn runner_step(c: &mut Criterion) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    let mut runner = GovernedRunner::new(kernel()).log_violations(false);
    runner.init(CheckOnly);
    let mut group = c.benchmark_group("runner_step");
    for (name, sql) in [
        ("select", "SELECT name FROM users WHERE id = 42"),
        ("drop_blocked", "DROP TABLE users"),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| black_box(rt.block_on(runner.step(black_box(sql), None))))
        });
    }
    group.finish();
}

fn policy_reward_call(c: &mut Criterion) {
    let reward: PolicyReward<(), ()> = PolicyReward::new(RewardConfig::default());
    let mut rollout = GovernedRollout::new(());
    rollout.success = true;
    rollout.violations = vec![
        PolicyViolation::new(PolicyViolationType::Warned, "a", "d", Severity::Low),
        PolicyViolation::new(PolicyViolationType::Blocked, "b", "d", Severity::High),
    ];
    c.bench_function("policy_reward_call", |b| {
        b.iter(|| black_box(reward.call(black_box(&rollout))))
    });
}

fn env_step(c: &mut Criterion) {
    let Ok(mut env) = GovernedEnvironment::new(
        kernel(),
        ActionTask::<()>::new(),
        EnvironmentConfig {
            max_steps: 50,
            ..EnvironmentConfig::default()
        },
    ) else {
        return;
    };
    c.bench_function("env_step", |b| {
        b.iter(|| {
            if env.terminated() || env.state().step_count == 0 {
                let _ = env.reset(None);
            }
            black_box(env.step(Action::sql("db", "SELECT name FROM users WHERE id = 42")))
        })
    });
}

criterion_group!(benches, runner_step, policy_reward_call, env_step);
criterion_main!(benches);
