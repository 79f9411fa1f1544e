#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]
//! Criterion benches of the store: the runner's rollout cycle (enqueue → dequeue → start
//! attempt → 10 spans → finish, see `agl_store::workload`) with 1, 8 and 64 concurrent workers,
//! and the spans query of one rollout among 1,000,000 stored spans, on every backend.
//!
//! Run: `cargo bench -p agl-store --bench store`. Each cycle sample runs 10,000 rollouts on a
//! fresh store (criterion reports rollouts/s as elements/s); `agl bench store` runs the full
//! 100,000-rollout cycles and reports p99 per operation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_store::workload::{fill_spans, run_cycles};
use agl_store::{InMemoryLightningStore, LightningStore, SpanQuery, SqliteLightningStore};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const CYCLE_ROLLOUTS: usize = 10_000;
const TOTAL_SPANS: usize = 1_000_000;

/// A fresh store of each backend, by name; the guard keeps temporary files alive.
type Factory = fn() -> (Arc<dyn LightningStore>, Option<tempfile::TempDir>);

fn memory() -> (Arc<dyn LightningStore>, Option<tempfile::TempDir>) {
    (Arc::new(InMemoryLightningStore::new()), None)
}

fn sqlite() -> (Arc<dyn LightningStore>, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteLightningStore::open(dir.path().join("bench.sqlite")).unwrap();
    (Arc::new(store), Some(dir))
}

fn backends() -> Vec<(&'static str, Factory)> {
    vec![("memory", memory as Factory), ("sqlite", sqlite as Factory)]
}

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("tokio runtime: {e}"),
    }
}

fn cycle(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("store_cycle");
    group.sample_size(10);
    group.throughput(Throughput::Elements(CYCLE_ROLLOUTS as u64));
    for (name, make) in backends() {
        for workers in [1usize, 8, 64] {
            group.bench_with_input(BenchmarkId::new(name, workers), &workers, |b, &workers| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let (store, _guard) = make();
                        let started = Instant::now();
                        let report = rt.block_on(run_cycles(store, CYCLE_ROLLOUTS, workers, 10));
                        if let Err(e) = report {
                            panic!("{name} cycle: {e}");
                        }
                        total += started.elapsed();
                    }
                    total
                });
            });
        }
    }
    group.finish();
}

fn query_spans(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("store_query_spans_1m");
    for (name, make) in backends() {
        let (store, _guard) = make();
        let ids = match rt.block_on(fill_spans(store.as_ref(), TOTAL_SPANS, 10)) {
            Ok(ids) => ids,
            Err(e) => panic!("{name} fill: {e}"),
        };
        let mut next = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                next = (next + 7919) % ids.len();
                let page = rt.block_on(store.query_spans(SpanQuery::of(&ids[next], None)));
                match page {
                    Ok(page) => assert_eq!(page.items.len(), 10),
                    Err(e) => panic!("{name} query: {e}"),
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, cycle, query_spans);
criterion_main!(benches);
