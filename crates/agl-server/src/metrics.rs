//! Prometheus metrics of the server, with Agent Lightning v0.3.0's metric names (protocol
//! reference §9), rendered in the Prometheus text format at `GET /metrics` and
//! `GET /v1/prometheus/`.
//!
//! Responsible for registering and updating:
//! * `agl_http_total` (counter) and `agl_http_latency` (histogram, seconds), labels `path`
//!   (the route template, e.g. `/v1/agl/rollouts/{rollout_id}`; `unmatched` for unknown
//!   paths), `method`, `status` (HTTP code);
//! * `agl_store_total` / `agl_store_latency` (seconds), labels `method` = `store_pubmeth` =
//!   the store operation (`enqueue_many`, `dequeue_many`, …) and `status` (`OK` or the error
//!   kind: `NotFound`, `InvalidTransition`, `Invalid`, `Closed`, `Backend`);
//! * `agl_rollouts_total` (counter) and `agl_rollouts_duration` (histogram, seconds of
//!   `end_time − start_time`), labels `status`, `mode` (`unknown` when null): rollouts seen
//!   reaching a terminal status through `update_attempt` or `update_rollout` requests.
//!
//! Histogram buckets are v0.3.0's `LATENCY_BUCKETS` (1 µs … 300 s). Each server owns its
//! recorder (no global registry), so several servers can run in one process (tests).
//! Not responsible for deciding what to observe; the handlers and middleware call it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use agl_core::Rollout;
use metrics::{Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// v0.3.0's `LATENCY_BUCKETS`, seconds (`AL:store/utils.py:12-57`).
pub const LATENCY_BUCKETS: &[f64] = &[
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 0.001, 0.002, 0.003, 0.005, 0.007, 0.01,
    0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 12.0,
    15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0,
];

static METADATA: Metadata<'static> = Metadata::new("agl_server", Level::INFO, None);

/// The cached metric families.
#[derive(Clone, Copy)]
enum Family {
    Http,
    Store,
}

impl Family {
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Family::Http => ("agl_http_total", "agl_http_latency"),
            Family::Store => ("agl_store_total", "agl_store_latency"),
        }
    }
}

/// A counter and a histogram with the same labels.
#[derive(Clone)]
struct Pair {
    count: metrics::Counter,
    latency: metrics::Histogram,
}

/// The metrics of one server. Handles are cached per label set, so a request costs one map
/// lookup instead of registering its metrics again.
#[derive(Clone)]
pub struct ServerMetrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    cache: Arc<RwLock<HashMap<String, Pair>>>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerMetrics")
    }
}

fn labels(pairs: &[(&'static str, &str)]) -> Vec<Label> {
    pairs
        .iter()
        .map(|(k, v)| Label::new(*k, (*v).to_string()))
        .collect()
}

impl ServerMetrics {
    /// A fresh registry with the reference buckets.
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new();
        // The bucket list is a non-empty constant, so `set_buckets` cannot fail; keep the
        // builder's defaults if it ever did.
        let builder = match builder.set_buckets(LATENCY_BUCKETS) {
            Ok(b) => b,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        ServerMetrics {
            recorder: Arc::new(recorder),
            handle,
            cache: Arc::new(RwLock::new(HashMap::new())),
        }
    }

    fn count(&self, name: &'static str, pairs: &[(&'static str, &str)]) {
        let key = Key::from_parts(name, labels(pairs));
        self.recorder.register_counter(&key, &METADATA).increment(1);
    }

    fn observe(&self, name: &'static str, pairs: &[(&'static str, &str)], seconds: f64) {
        let key = Key::from_parts(name, labels(pairs));
        self.recorder
            .register_histogram(&key, &METADATA)
            .record(seconds);
    }

    /// The cached counter and histogram of `family` whose label values `key` identifies;
    /// `labels` builds the labels when they are registered (first use only).
    fn pair(&self, key: String, family: Family, labels: impl FnOnce() -> Vec<Label>) -> Pair {
        if let Some(p) = self.cache.read().ok().and_then(|c| c.get(&key).cloned()) {
            return p;
        }
        let (total, latency) = family.names();
        let labels = labels();
        let pair = Pair {
            count: self
                .recorder
                .register_counter(&Key::from_parts(total, labels.clone()), &METADATA),
            latency: self
                .recorder
                .register_histogram(&Key::from_parts(latency, labels), &METADATA),
        };
        if let Ok(mut c) = self.cache.write() {
            c.insert(key, pair.clone());
        }
        pair
    }

    /// One HTTP request finished.
    pub fn http(&self, path: &str, method: &str, status: u16, elapsed: Duration) {
        let p = self.pair(format!("{method} {status} {path}"), Family::Http, || {
            let status = status.to_string();
            labels(&[("path", path), ("method", method), ("status", &status)])
        });
        p.count.increment(1);
        p.latency.record(elapsed.as_secs_f64());
    }

    /// One store operation finished with `status` (`OK` or the error kind).
    pub fn store(&self, method: &str, status: &str, elapsed: Duration) {
        let p = self.pair(format!("{method} {status}"), Family::Store, || {
            labels(&[
                ("method", method),
                ("store_pubmeth", method),
                ("status", status),
            ])
        });
        p.count.increment(1);
        p.latency.record(elapsed.as_secs_f64());
    }

    /// Records `rollout` in `agl_rollouts_*` if it is finished with an `end_time` not before
    /// `finished_since` (Unix seconds; callers pass the start of the change they observed, so
    /// a rollout that had finished earlier is not counted again).
    pub fn rollout(&self, rollout: &Rollout, finished_since: f64) {
        if let Some(end) = rollout.end_time
            && rollout.status.is_finished()
            && end >= finished_since
        {
            let mode = rollout
                .mode
                .map_or("unknown".to_string(), |m| m.to_string());
            self.rollout_finished(&rollout.status.to_string(), &mode, end - rollout.start_time);
        }
    }

    /// A rollout reached terminal `status` after `duration_seconds`.
    pub fn rollout_finished(&self, status: &str, mode: &str, duration_seconds: f64) {
        let pairs = [("status", status), ("mode", mode)];
        self.count("agl_rollouts_total", &pairs);
        self.observe("agl_rollouts_duration", &pairs, duration_seconds.max(0.0));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_reference_names_with_labels_and_buckets() {
        let m = ServerMetrics::new();
        m.http(
            "/v1/agl/rollouts/{rollout_id}",
            "GET",
            200,
            Duration::from_millis(3),
        );
        m.store("enqueue_many", "OK", Duration::from_micros(40));
        m.rollout_finished("succeeded", "train", 1.5);
        let text = m.render();
        assert!(
            text.contains(
                r#"agl_http_total{path="/v1/agl/rollouts/{rollout_id}",method="GET",status="200"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains("agl_http_latency_bucket"), "{text}");
        assert!(text.contains(r#"le="0.003""#), "{text}");
        assert!(text.contains("agl_store_total"), "{text}");
        assert!(
            text.contains(r#"agl_rollouts_total{status="succeeded",mode="train"} 1"#),
            "{text}"
        );
    }
}
