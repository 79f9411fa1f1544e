//! Per-check cost of governance (criterion): `cargo bench -p agl-spider --bench kernel`
//! (it lives with the task whose data it reads; `agl-gov` depends on no task).
//!
//! Every benchmark measures ONE check per iteration, cycling through the inputs, so criterion's
//! time per iteration is the mean time per check:
//! * `sql_policy/spider_dev_gold`: `SqlPolicy` alone (parse + walk) on each Spider dev gold query;
//! * `standard_kernel/spider_dev_gold`: the `standard` preset's kernel, table statistics of the
//!   Spider databases loaded, on the same queries (SQL parsing included, parsed once per check);
//! * `standard_kernel_recorder/spider_dev_gold`: the same with an in-memory flight recorder;
//! * `standard_kernel/tool_call`: the `standard` kernel on a tool call.
//!
//! Tail latency (p50 / p99) is reported by `agl bench governance`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use agl_gov::{
    Action, BuildEnv, FlightRecorder, GovernanceMode, Kernel, PolicyFile, SqlPolicy, TableStats,
};
use agl_spider::{SpiderDataset, Split, db_info};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn spider() -> (Vec<Action>, TableStats) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/spider");
    let dataset = SpiderDataset::load(&root).expect("vendored Spider data");
    let mut stats = TableStats::new();
    for db in dataset.database_ids(Split::Dev) {
        let info = db_info(&db, &dataset.db_path(&db)).expect("database");
        stats.insert(db, info.row_counts());
    }
    let actions = dataset
        .questions(Split::Dev)
        .iter()
        .map(|q| Action::sql(&q.db_id, &q.gold_sql).with_rollout_id("bench"))
        .collect();
    (actions, stats)
}

/// One check per iteration, cycling through `actions`.
fn per_check(c: &mut Criterion, group: &str, name: &str, actions: &[Action], kernel: &Kernel) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function(name, |b| {
        b.iter(|| {
            let a = &actions[i % actions.len()];
            i = i.wrapping_add(1);
            black_box(kernel.check(black_box(a)).map(|d| d.verdict))
        })
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    let (actions, stats) = spider();
    let standard = PolicyFile::preset("standard").unwrap();
    let env = BuildEnv {
        table_stats: stats,
        mode: None,
        check_cache: None,
    };
    let sql_only = Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::default());
    per_check(c, "sql_policy", "spider_dev_gold", &actions, &sql_only);
    let kernel = standard.build(&env).unwrap();
    per_check(c, "standard_kernel", "spider_dev_gold", &actions, &kernel);
    let recorded = standard
        .build(&env)
        .unwrap()
        .with_shared_recorder(Arc::new(FlightRecorder::in_memory()));
    per_check(
        c,
        "standard_kernel_recorder",
        "spider_dev_gold",
        &actions,
        &recorded,
    );
    let tools: Vec<Action> = (0..64)
        .map(|i| {
            Action::tool_call(
                "search_docs",
                serde_json::json!({"query": format!("question {i}"), "limit": 10}),
            )
            .with_rollout_id("bench")
        })
        .collect();
    per_check(c, "standard_kernel", "tool_call", &tools, &kernel);
}

criterion_group!(benches, bench);
criterion_main!(benches);
