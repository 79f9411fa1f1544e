//! The check cache: what a kernel may remember between checks of the same SQL statement.
//!
//! Training repeats statements: GRPO samples the same candidates many times, and an LLM agent
//! writes the same short queries again and again. What a **pure policy**
//! ([`crate::Policy::is_pure`]: no context, no state) finds in a statement is a function of the
//! action kind and the policy's configuration, so the kernel keeps it: one record per `(policy
//! version, dialect, database, sql)` holding the findings of each pure policy by its position
//! in the kernel (one lookup and, on a first sight, one insert per statement, whatever the
//! number of policies). The policy version identifies a policy
//! set: for a kernel built from a policy file it is a digest of the file's declarations and the
//! table statistics it was built with ([`crate::PolicyFile::build`]), so kernels built from the
//! same file (a training run's kernel per mode, its evaluation kernel) share their entries, and
//! kernels of different files never do; a kernel assembled by hand gets a version of its own.
//! A hit skips the parse too: when every pure policy's findings are cached, nothing parses the
//! statement (stateful policies that need the parse still parse it).
//!
//! Parses themselves are not cached: a parsed Spider statement holds about 33 KB of sqlparser
//! AST (measured: 370 MB for the 11,237 distinct statements of a four-mode `agl train`), and
//! keeping them made a first sight about 7× slower than parsing without a cache (95 µs against
//! 13 µs, replaying that run), while the findings of a statement take a few hundred bytes.
//!
//! Stateful policies (budgets, rate limits, Cedar's context) still run on every action, every
//! policy is still told every outcome, and the flight recorder still records every check: the
//! cache only skips recomputing what cannot have changed. Only SQL actions are cached (tool
//! arguments and model output rarely repeat). Policy errors and panics are never cached (the
//! kernel fails closed again next time).
//!
//! Bounded by weight (an estimate of the bytes an entry holds), evicted by quick_cache's S3-FIFO
//! policy; hits and misses are counted ([`CacheStats`]).

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use quick_cache::{Equivalent, Weighter, sync::Cache};
use serde::{Deserialize, Serialize};

use crate::action::SqlDialect;
use crate::types::Finding;

/// Default capacity of a [`CheckCache`]: 64 MiB of records (estimated; about 150,000 Spider
/// statements).
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// The findings of a kernel's pure policies on one statement: `(policy position, findings)`,
/// by position.
pub(crate) type Record = Arc<[(u32, Arc<[Finding]>)]>;

#[derive(Debug, PartialEq, Eq, Hash)]
struct RecordKey {
    version: u64,
    dialect: SqlDialect,
    database: Box<str>,
    sql: Box<str>,
}

/// A borrowed [`RecordKey`] (same field order and hashed types: `str` hashes alike boxed or
/// borrowed), so a lookup allocates nothing.
#[derive(Hash)]
pub(crate) struct StatementRef<'a> {
    pub(crate) version: u64,
    pub(crate) dialect: SqlDialect,
    pub(crate) database: &'a str,
    pub(crate) sql: &'a str,
}

impl Equivalent<RecordKey> for StatementRef<'_> {
    fn equivalent(&self, key: &RecordKey) -> bool {
        self.version == key.version
            && self.dialect == key.dialect
            && self.database == &*key.database
            && self.sql == &*key.sql
    }
}

/// Estimated bytes of a record and its key.
#[derive(Clone)]
struct RecordWeight;

impl Weighter<RecordKey, Record> for RecordWeight {
    fn weight(&self, key: &RecordKey, record: &Record) -> u64 {
        let findings: usize = record
            .iter()
            .map(|(_, f)| 24 + f.iter().map(|f| 128 + f.reason.len()).sum::<usize>())
            .sum();
        (96 + key.sql.len() + key.database.len() + findings) as u64
    }
}

/// Hit and miss counts of a [`CheckCache`] since it was made, one per pure-policy lookup.
/// JSON fields as named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Pure-policy findings served from the cache.
    pub verdict_hits: u64,
    /// Pure-policy checks that ran (and were then cached).
    pub verdict_misses: u64,
}

impl CacheStats {
    /// Share of pure-policy lookups that hit (0 when there were none).
    pub fn verdict_hit_rate(&self) -> f64 {
        let n = self.verdict_hits + self.verdict_misses;
        if n == 0 {
            0.0
        } else {
            self.verdict_hits as f64 / n as f64
        }
    }
}

/// A bounded, concurrent cache of pure-policy findings, shared by any number of kernels (see
/// the module docs). `Send + Sync`; share it through an `Arc`.
pub struct CheckCache {
    records: Cache<RecordKey, Record, RecordWeight>,
    /// The findings of every policy that found nothing (most of them), shared.
    nothing: Arc<[Finding]>,
    verdict_hits: AtomicU64,
    verdict_misses: AtomicU64,
}

impl std::fmt::Debug for CheckCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckCache")
            .field("statements", &self.records.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for CheckCache {
    fn default() -> Self {
        Self::new(DEFAULT_CACHE_BYTES)
    }
}

impl CheckCache {
    /// A cache holding about `bytes` of records and keys (estimated).
    pub fn new(bytes: u64) -> Self {
        CheckCache {
            records: Cache::with_weighter(4096, bytes.max(1), RecordWeight),
            nothing: Arc::from(Vec::new()),
            verdict_hits: AtomicU64::new(0),
            verdict_misses: AtomicU64::new(0),
        }
    }

    /// Hit and miss counts so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            verdict_hits: self.verdict_hits.load(Ordering::Relaxed),
            verdict_misses: self.verdict_misses.load(Ordering::Relaxed),
        }
    }

    /// Statements with a record.
    pub fn statements(&self) -> usize {
        self.records.len()
    }

    /// The record of `statement`, if any (not counted: see [`CheckCache::count`]).
    pub(crate) fn record(&self, statement: &StatementRef<'_>) -> Option<Record> {
        self.records.get(statement)
    }

    /// Counts one pure-policy lookup.
    pub(crate) fn count(&self, hit: bool) {
        let counter = if hit {
            &self.verdict_hits
        } else {
            &self.verdict_misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores `record` (sorted by position) for `statement`, replacing any previous one.
    pub(crate) fn store(&self, statement: &StatementRef<'_>, record: Record) {
        self.records.insert(
            RecordKey {
                version: statement.version,
                dialect: statement.dialect,
                database: statement.database.into(),
                sql: statement.sql.into(),
            },
            record,
        );
    }
}

/// The kernel's view of one statement's record during one check: looked up on the first pure
/// policy, completed with what the policies that missed found, stored back at the end.
pub(crate) struct Memo<'a> {
    cache: &'a CheckCache,
    statement: StatementRef<'a>,
    record: Option<Option<Record>>,
    learned: Vec<(u32, Arc<[Finding]>)>,
}

impl<'a> Memo<'a> {
    /// A memo for `statement` in `cache`, for a kernel of `policies` policies.
    pub(crate) fn new(cache: &'a CheckCache, statement: StatementRef<'a>, policies: usize) -> Self {
        Memo {
            cache,
            statement,
            record: None,
            learned: Vec::with_capacity(policies),
        }
    }

    /// The cached findings of the policy at `position`, counting the hit or miss.
    pub(crate) fn get(&mut self, position: u32) -> Option<Arc<[Finding]>> {
        let (cache, statement) = (self.cache, &self.statement);
        let record = self.record.get_or_insert_with(|| cache.record(statement));
        let found = record.as_ref().and_then(|r| {
            r.iter()
                .find(|(p, _)| *p == position)
                .map(|(_, f)| f.clone())
        });
        self.cache.count(found.is_some());
        found
    }

    /// Remembers what the policy at `position` found (after a miss).
    pub(crate) fn learn(&mut self, position: u32, findings: &[Finding]) {
        let findings = if findings.is_empty() {
            self.cache.nothing.clone()
        } else {
            findings.into()
        };
        self.learned.push((position, findings));
    }

    /// Stores the record, completed with what was learned, when anything was.
    pub(crate) fn finish(self) {
        if self.learned.is_empty() {
            return;
        }
        let record = match self.record.flatten() {
            None => self.learned,
            Some(old) => {
                let mut all = old.to_vec();
                for (p, f) in self.learned {
                    if !all.iter().any(|(q, _)| *q == p) {
                        all.push((p, f));
                    }
                }
                all.sort_by_key(|(p, _)| *p);
                all
            }
        };
        self.cache.store(&self.statement, record.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Severity;

    fn at<'a>(version: u64, dialect: SqlDialect, db: &'a str, sql: &'a str) -> StatementRef<'a> {
        StatementRef {
            version,
            dialect,
            database: db,
            sql,
        }
    }

    #[test]
    fn records_are_keyed_by_every_part_and_completed_as_learned() {
        let c = CheckCache::default();
        let f = [Finding::block(Severity::High, "no")];
        let drop = "DROP TABLE t";
        let mut m = Memo::new(&c, at(1, SqlDialect::Sqlite, "db", drop), 3);
        assert!(m.get(0).is_none());
        m.learn(0, &f);
        m.finish();
        let mut m = Memo::new(&c, at(1, SqlDialect::Sqlite, "db", drop), 3);
        assert_eq!(m.get(0).as_deref(), Some(&f[..]));
        // A position the record lacks is a miss; learning it completes the record.
        assert!(m.get(2).is_none());
        m.learn(2, &[]);
        m.finish();
        let mut m = Memo::new(&c, at(1, SqlDialect::Sqlite, "db", drop), 3);
        assert_eq!(m.get(0).as_deref(), Some(&f[..]));
        assert_eq!(m.get(2).as_deref(), Some(&[][..]));
        for other in [
            at(2, SqlDialect::Sqlite, "db", drop),
            at(1, SqlDialect::Mysql, "db", drop),
            at(1, SqlDialect::Sqlite, "other", drop),
            at(1, SqlDialect::Sqlite, "db", "DROP TABLE u"),
        ] {
            assert!(Memo::new(&c, other, 1).get(0).is_none());
        }
        let s = c.stats();
        assert_eq!((s.verdict_hits, s.verdict_misses), (3, 6));
        assert!((s.verdict_hit_rate() - 3.0 / 9.0).abs() < 1e-12);
        assert_eq!(c.statements(), 1);
    }

    #[test]
    fn the_cache_stays_within_its_capacity() {
        let c = CheckCache::new(64 << 10);
        for i in 0..10_000 {
            let sql = format!("SELECT {i} FROM t WHERE x = {i}");
            let mut m = Memo::new(&c, at(1, SqlDialect::Sqlite, "db", &sql), 1);
            m.learn(0, &[]);
            m.finish();
        }
        let approx = (96 + 2 + 30 + 24) * c.statements();
        assert!(approx <= 80 << 10, "{approx} bytes held");
        assert!(c.statements() > 100, "{}", c.statements());
    }
}
