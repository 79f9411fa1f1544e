//! Throughput of governance checks (criterion): `cargo bench -p agl-gov`.
//!
//! Measures what every rollout pays before its action runs: the SQL policy alone (parse and
//! walk), the cost policy alone, and the full kernel with both policies, with and without an
//! in-memory flight recorder. The statements are Spider-style queries and the unsafe kinds the
//! built-in task generates.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;

use agl_gov::{
    Action, CostConfig, CostControlPolicy, FlightRecorder, GovernanceMode, Kernel, Policy,
    SqlPolicy, Subject, TableStats,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const STATEMENTS: &[&str] = &[
    "SELECT count(*) FROM singer",
    "SELECT T2.name FROM singer_in_concert AS T1 JOIN singer AS T2 ON T1.singer_id = T2.singer_id \
     WHERE T1.concert_id IN (SELECT concert_id FROM concert WHERE YEAR = 2014)",
    "SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert) \
     ORDER BY capacity DESC LIMIT 1",
    "SELECT country, count(*) FROM singer GROUP BY country HAVING count(*) > 1 \
     INTERSECT SELECT country FROM singer WHERE age > 40",
    "SELECT count(*) FROM singer; DELETE FROM singer",
    "DROP TABLE singer",
    "UPDATE singer SET age = NULL",
    "SELECT * FROM (SELECT name FROM singer) WHERE EXISTS (SELECT 1 FROM singer AS g1, singer AS g2, singer AS g3)",
];

fn stats() -> TableStats {
    let mut tables = HashMap::new();
    for (t, n) in [
        ("singer", 1000u64),
        ("concert", 200),
        ("stadium", 50),
        ("singer_in_concert", 3000),
    ] {
        tables.insert(t.to_string(), n);
    }
    let mut s = TableStats::new();
    s.insert("concert_singer".to_string(), tables);
    s
}

fn actions() -> Vec<Action> {
    STATEMENTS
        .iter()
        .map(|sql| Action::sql("concert_singer", *sql))
        .collect()
}

fn bench(c: &mut Criterion) {
    let actions = actions();
    let mut group = c.benchmark_group("governance");
    group.throughput(Throughput::Elements(actions.len() as u64));

    let sql = SqlPolicy::default();
    group.bench_function("sql_policy", |b| {
        b.iter(|| {
            actions
                .iter()
                .map(|a| sql.check(&Subject::new(black_box(a))).unwrap().len())
                .sum::<usize>()
        })
    });
    let cost = CostControlPolicy::new(CostConfig::default(), stats());
    group.bench_function("cost_policy", |b| {
        b.iter(|| {
            actions
                .iter()
                .map(|a| cost.check(&Subject::new(black_box(a))).unwrap().len())
                .sum::<usize>()
        })
    });
    let kernel = Kernel::new(GovernanceMode::Enforce)
        .with_policy(SqlPolicy::default())
        .with_policy(CostControlPolicy::new(CostConfig::default(), stats()));
    group.bench_function("kernel", |b| {
        b.iter(|| {
            actions
                .iter()
                .map(|a| {
                    kernel
                        .check(black_box(a))
                        .map(|d| d.violations.len())
                        .unwrap_or(0)
                })
                .sum::<usize>()
        })
    });
    group.bench_function("kernel_with_recorder", |b| {
        // A fresh in-memory recorder per batch keeps memory flat.
        b.iter_batched(
            || {
                Kernel::new(GovernanceMode::Enforce)
                    .with_policy(SqlPolicy::default())
                    .with_policy(CostControlPolicy::new(CostConfig::default(), stats()))
                    .with_recorder(FlightRecorder::in_memory())
            },
            |k| {
                actions
                    .iter()
                    .map(|a| {
                        k.check(black_box(a))
                            .map(|d| d.violations.len())
                            .unwrap_or(0)
                    })
                    .sum::<usize>()
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
