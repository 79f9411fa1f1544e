//! The [`Policy`] trait, the [`Subject`] a policy inspects, and the [`Kernel`] that runs every
//! policy on every action.
//!
//! Responsible for the verdict rule (enforce vs audit, "block wins, then modify, then warn"),
//! failing closed when a policy errors or panics (a panic inside the SQL parser is not a policy
//! panic: [`parse_sql`] turns it into a silent parse failure), applying per-policy configuration
//! ([`PolicyOptions`]), signals, telling policies what happened (`record_outcome`) and
//! appending one flight-recorder entry per decision. Not responsible for executing actions (the
//! caller does that when [`Decision::executes`] is true) nor for what any individual policy
//! checks.
//!
//! The check is synchronous on purpose: it is CPU-bound and takes microseconds, so an async
//! interface would only add overhead; async callers call it inline.
//!
//! With a [`CheckCache`] ([`Kernel::with_check_cache`], or `BuildEnv::check_cache` for a
//! policy file's kernel) the findings of a SQL action's pure policies ([`Policy::is_pure`])
//! come from the cache when the statement was seen before, and then nothing parses it unless a
//! stateful policy needs to; everything else happens on every check. [`Kernel::stats`] counts checks, how many were answered from the
//! cache, and the time spent in policies.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashSet;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind};
use crate::cache::{CheckCache, Memo, StatementRef};
use crate::error::GovError;
use crate::policies::sql_text::{ParsedSql, parse_sql};
use crate::recorder::FlightRecorder;
use crate::sql_arguments::SqlArgument;
use crate::types::{
    Decision, Effect, Finding, GovernanceMode, OnBlock, Severity, Signal, Verdict, Violation,
};

/// What a policy inspects: the action (possibly already rewritten by an earlier policy) and
/// lazily computed, shared analyses of it, so that several policies looking at the same SQL
/// parse it once.
pub struct Subject<'a> {
    action: Cow<'a, Action>,
    sql: OnceCell<ParsedSql>,
}

impl fmt::Debug for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject")
            .field("action", &self.action)
            .finish_non_exhaustive()
    }
}

impl<'a> Subject<'a> {
    /// A subject for `action`.
    pub fn new(action: &'a Action) -> Self {
        Self::of(Cow::Borrowed(action))
    }

    fn of(action: Cow<'a, Action>) -> Self {
        Subject {
            action,
            sql: OnceCell::new(),
        }
    }

    /// Whether a policy has parsed the action's SQL through [`Subject::sql`].
    fn parsed(&self) -> bool {
        self.sql.get().is_some()
    }

    /// The action under check.
    pub fn action(&self) -> &Action {
        &self.action
    }

    /// The parsed form of the action's SQL (parsed on first use, then cached); `None` for
    /// non-SQL actions.
    pub fn sql(&self) -> Option<&ParsedSql> {
        match &self.action.kind {
            ActionKind::Sql { sql, dialect, .. } => {
                Some(self.sql.get_or_init(|| parse_sql(sql, *dialect)))
            }
            _ => None,
        }
    }
}

/// A governance rule. Implementations must be cheap to share between threads: the kernel is
/// used through an `Arc` by many worker threads at once.
pub trait Policy: Send + Sync {
    /// Stable snake_case name of the policy type (e.g. `sql_safety`); the kernel uses it as the
    /// violation's `policy` unless [`PolicyOptions::name`] overrides it.
    fn name(&self) -> &str;

    /// Inspects an action before it runs. An empty vector means "no finding". Must never panic,
    /// whatever the input (the kernel fails closed if it does).
    ///
    /// # Errors
    /// Any [`GovError`] when the policy cannot decide (e.g. a Cedar request that cannot be
    /// built); the kernel turns it into a blocking, high-severity violation (fail closed).
    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError>;

    /// Whether [`Policy::check`] on an action of `kind` is a pure function of that kind (its
    /// SQL text, database and dialect, say) and of the policy's configuration: it reads no
    /// context and no state. The kernel may then reuse its findings for an equal kind (see
    /// [`CheckCache`]). The default, `false`, is always safe.
    fn is_pure(&self, _kind: &ActionKind) -> bool {
        false
    }

    /// Called by the kernel after deciding, on every policy, with the action that executes (the
    /// rewrite, if any) and whether it executes (`executed == decision.executes()`). Stateful
    /// policies (budgets, rate limits, call counts) update their state here. The default does
    /// nothing.
    fn record_outcome(&self, _subject: &Subject<'_>, _executed: bool) {}

    /// Called by [`Kernel::end_rollout`] when a rollout is finished: policies that keep
    /// per-rollout state (spend, call counts) drop it. The default does nothing.
    fn end_rollout(&self, _rollout_id: &str) {}

    /// Called by [`Kernel::reset`]: forget every piece of state (all rollouts' spend and call
    /// counts, the run's spend, rate-limit windows), as if the policy had just been built. A
    /// Gymnasium-style environment calls it at each `reset` when configured to. The default
    /// does nothing.
    fn reset(&self) {}
}

/// Per-policy configuration applied by the kernel to every finding of that policy (the common
/// keys of a policy file entry). JSON/YAML fields: `name`, `severity`, `penalty`, `effect`,
/// `signal`, all optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyOptions {
    /// Name recorded in violations instead of the policy type's name.
    pub name: Option<String>,
    /// Severity of every finding, replacing the policy's own.
    pub severity: Option<Severity>,
    /// Penalty (positive reward units) of every finding, replacing the policy's own.
    pub penalty: Option<f64>,
    /// Effect of every finding (e.g. `warn` to observe a policy without enforcing it). A
    /// `modify` applied to a finding that carries no rewrite acts as `warn`.
    pub effect: Option<Effect>,
    /// Signal sent with every finding.
    pub signal: Option<Signal>,
}

impl PolicyOptions {
    fn apply(&self, mut f: Finding) -> Finding {
        if let Some(s) = self.severity {
            f.severity = s;
        }
        if let Some(p) = self.penalty {
            f.penalty = Some(p);
        }
        if let Some(e) = self.effect {
            f.effect = e;
        }
        if let Some(s) = self.signal {
            f.signal = Some(s);
        }
        if f.effect == Effect::Modify && f.rewrite.is_none() {
            f.effect = Effect::Warn;
        }
        f
    }
}

struct Entry {
    name: String,
    options: PolicyOptions,
    policy: Box<dyn Policy>,
}

/// The governance kernel: an ordered list of policies, a mode, and an optional flight recorder.
///
/// `Kernel` is `Send + Sync`; share one instance through an `Arc`.
pub struct Kernel {
    mode: GovernanceMode,
    policies: Vec<Entry>,
    recorder: Option<Arc<FlightRecorder>>,
    /// Agents (agent id, else rollout id) that were sent SIGSTOP and not yet SIGCONT.
    stopped: Mutex<HashSet<String>>,
    /// The check cache and this kernel's policy version in it.
    cache: Option<(Arc<CheckCache>, u64)>,
    /// Tool arguments that carry SQL.
    sql_arguments: Vec<SqlArgument>,
    /// What the LLM gateway tells an agent whose model output is blocked.
    on_block: OnBlock,
    checks: AtomicU64,
    cached_checks: AtomicU64,
    check_nanos: AtomicU64,
    latency: Latency,
}

/// A log-linear histogram of check times (8 buckets per power of two of nanoseconds: within
/// 12.5% of the true quantile), lock-free.
struct Latency {
    buckets: Box<[AtomicU64]>,
}

impl Latency {
    const BUCKETS: usize = 496;

    fn new() -> Self {
        Latency {
            buckets: (0..Self::BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn index(ns: u64) -> usize {
        if ns < 8 {
            return ns as usize;
        }
        let e = 63 - ns.leading_zeros() as usize;
        let sub = ((ns >> (e - 3)) & 7) as usize;
        ((e - 2) * 8 + sub).min(Self::BUCKETS - 1)
    }

    /// The lower bound of bucket `i`, nanoseconds.
    fn lower(i: usize) -> u64 {
        if i < 8 {
            return i as u64;
        }
        let (e, sub) = (i / 8 + 2, (i % 8) as u64);
        (8 + sub) << (e - 3)
    }

    fn record(&self, ns: u64) {
        if let Some(b) = self.buckets.get(Self::index(ns)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `q`-quantile in microseconds (the lower bound of its bucket); 0 when empty.
    fn quantile_us(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::lower(i) as f64 / 1e3;
            }
        }
        0.0
    }
}

/// What a kernel's checks cost ([`Kernel::stats`]). JSON fields as named; seconds and
/// microseconds as named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelStats {
    /// Checks ([`Kernel::check`]) so far.
    pub checks: u64,
    /// Checks answered from the check cache: a SQL action that was not parsed and whose pure
    /// policies' findings were all cached (impure policies still ran).
    pub cached_checks: u64,
    /// `cached_checks / checks` (0 without checks).
    pub hit_rate: f64,
    /// Time spent deciding and telling policies the outcome, summed over checks (the flight
    /// recorder's append is not included).
    pub check_seconds: f64,
    /// Mean time per check, microseconds (0 without checks). Wall-clock time: it includes a
    /// thread being descheduled mid-check, which the median does not feel.
    pub mean_check_us: f64,
    /// Median time per check, microseconds (within 12.5%; 0 without checks).
    #[serde(default)]
    pub p50_check_us: f64,
    /// 99th percentile of the time per check, microseconds (within 12.5%).
    #[serde(default)]
    pub p99_check_us: f64,
    /// Checks per second of checking time: what one thread sustains (0 without checks).
    pub checks_per_second: f64,
}

impl KernelStats {
    fn new(checks: u64, cached_checks: u64, check_seconds: f64, latency: &Latency) -> Self {
        let per = |x: f64| if checks == 0 { 0.0 } else { x / checks as f64 };
        KernelStats {
            checks,
            cached_checks,
            hit_rate: per(cached_checks as f64),
            check_seconds,
            mean_check_us: per(check_seconds * 1e6),
            p50_check_us: latency.quantile_us(0.5),
            p99_check_us: latency.quantile_us(0.99),
            checks_per_second: if check_seconds > 0.0 {
                checks as f64 / check_seconds
            } else {
                0.0
            },
        }
    }
}

/// Policy versions of kernels assembled by hand: each gets its own (the top bit set keeps them
/// apart from policy-file digests, whose top bit is clear).
static NEXT_PRIVATE_VERSION: AtomicU64 = AtomicU64::new(1 << 63);

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("mode", &self.mode)
            .field("policies", &self.policy_names())
            .field("recorder", &self.recorder)
            .finish()
    }
}

/// Severity of the violation a failing (erroring or panicking) policy produces.
pub const FAIL_CLOSED_SEVERITY: Severity = Severity::High;

impl Kernel {
    /// A kernel with no policies (every action is allowed) and no recorder.
    pub fn new(mode: GovernanceMode) -> Self {
        Kernel {
            mode,
            policies: Vec::new(),
            recorder: None,
            stopped: Mutex::new(HashSet::new()),
            cache: None,
            sql_arguments: Vec::new(),
            on_block: OnBlock::default(),
            checks: AtomicU64::new(0),
            cached_checks: AtomicU64::new(0),
            check_nanos: AtomicU64::new(0),
            latency: Latency::new(),
        }
    }

    /// Caches SQL parses and pure-policy findings in `cache` (see the module docs). This
    /// kernel's entries are its own: a kernel assembled by hand cannot know that another has
    /// the same policies. Kernels built from one policy file share entries instead
    /// (`BuildEnv::check_cache`).
    pub fn with_check_cache(self, cache: Arc<CheckCache>) -> Self {
        let version = NEXT_PRIVATE_VERSION.fetch_add(1, Ordering::Relaxed) | (1 << 63);
        self.with_check_cache_version(cache, version)
    }

    /// Caches in `cache` under policy version `version` (a digest of the policy set).
    pub(crate) fn with_check_cache_version(mut self, cache: Arc<CheckCache>, version: u64) -> Self {
        self.cache = Some((cache, version));
        self
    }

    /// The check cache, if one was set.
    pub fn check_cache(&self) -> Option<&Arc<CheckCache>> {
        self.cache.as_ref().map(|(c, _)| c)
    }

    /// Checks so far, how many the cache answered, and the time they took.
    pub fn stats(&self) -> KernelStats {
        KernelStats::new(
            self.checks.load(Ordering::Relaxed),
            self.cached_checks.load(Ordering::Relaxed),
            self.check_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            &self.latency,
        )
    }

    /// Adds a policy with default options; policies run in the order they were added.
    pub fn with_policy(self, p: impl Policy + 'static) -> Self {
        self.with_policy_options(p, PolicyOptions::default())
    }

    /// Adds a policy with per-policy options.
    pub fn with_policy_options(self, p: impl Policy + 'static, options: PolicyOptions) -> Self {
        self.with_boxed_policy(Box::new(p), options)
    }

    /// Adds an already boxed policy with per-policy options.
    pub fn with_boxed_policy(mut self, p: Box<dyn Policy>, options: PolicyOptions) -> Self {
        let name = options.name.clone().unwrap_or_else(|| p.name().to_string());
        self.policies.push(Entry {
            name,
            options,
            policy: p,
        });
        self
    }

    /// Sets the flight recorder that receives one entry per [`Kernel::check`].
    pub fn with_recorder(self, r: FlightRecorder) -> Self {
        self.with_shared_recorder(Arc::new(r))
    }

    /// Sets a flight recorder shared with other kernels (for example the kernels of a training
    /// run and of its evaluation), so all their checks form one hash chain.
    pub fn with_shared_recorder(mut self, r: Arc<FlightRecorder>) -> Self {
        self.recorder = Some(r);
        self
    }

    /// The same kernel in another mode.
    pub fn with_mode(mut self, mode: GovernanceMode) -> Self {
        self.mode = mode;
        self
    }

    /// The mode given at construction.
    pub fn mode(&self) -> GovernanceMode {
        self.mode
    }

    /// Declares a tool argument that carries SQL: a `tool_call` to `mark.tool` is also checked
    /// as the `sql` action it carries (see [`Kernel::check`]). Declarations are tried in the
    /// order they were added; the first that applies to a call is used.
    pub fn with_sql_argument(mut self, mark: SqlArgument) -> Self {
        self.sql_arguments.push(mark);
        self
    }

    /// The declared SQL-carrying tool arguments, in order.
    pub fn sql_arguments(&self) -> &[SqlArgument] {
        &self.sql_arguments
    }

    /// Sets what the LLM gateway tells an agent whose model output is blocked (default
    /// [`OnBlock::Refuse`]). The kernel itself decides the same either way; the setting
    /// travels with the kernel so that every gateway built from a policy file honours the
    /// file's `on_block`.
    pub fn with_on_block(mut self, on_block: OnBlock) -> Self {
        self.on_block = on_block;
        self
    }

    /// What the LLM gateway tells an agent whose model output is blocked.
    pub fn on_block(&self) -> OnBlock {
        self.on_block
    }

    /// Names of the policies (as recorded in violations), in the order they run.
    pub fn policy_names(&self) -> Vec<String> {
        self.policies.iter().map(|p| p.name.clone()).collect()
    }

    /// The flight recorder, if one was set.
    pub fn recorder(&self) -> Option<&FlightRecorder> {
        self.recorder.as_deref()
    }

    /// The flight recorder as a shared handle (to give to a reader such as an emitter).
    pub fn shared_recorder(&self) -> Option<Arc<FlightRecorder>> {
        self.recorder.clone()
    }

    /// Checks one action.
    ///
    /// 1. Runs every policy in order on a [`Subject`]. In enforce mode a `modify` finding
    ///    replaces the action for the policies after it (so a redaction is checked again by the
    ///    SQL policy, say); in audit mode every policy sees the original action. A policy that
    ///    returns an error or panics yields a blocking violation of severity
    ///    [`FAIL_CLOSED_SEVERITY`] whose reason says so (fail closed).
    /// 2. Applies each policy's [`PolicyOptions`] to its findings.
    /// 3. Verdict, enforce mode: `Block` if any finding blocks, else `Modify` if any rewrote the
    ///    action, else `Warn` if there is any finding, else `Allow`. Audit mode: findings are
    ///    kept exactly as found (to show what enforce would have done) but the verdict is `Warn`
    ///    if there is any, else `Allow`; nothing is rewritten and no signal is sent.
    /// 4. Signals (enforce mode): those of the findings, deduplicated, in order. An agent that
    ///    was sent `SIGSTOP` gets `SIGCONT` with its next decision that is not a block and has
    ///    no `SIGSTOP`. Agents are keyed by `context.agent_id`, else `context.rollout_id`.
    /// 5. Calls [`Policy::record_outcome`] on every policy with the action that executes.
    /// 6. Appends one entry to the flight recorder, if set.
    ///
    /// # Tool calls that carry SQL
    /// When the action is a `tool_call` and a declared [`SqlArgument`]
    /// ([`Kernel::with_sql_argument`], a policy file's `sql_arguments`) applies to it (same
    /// tool, and its argument is a string), steps 1-3 also run on the `sql` action it carries
    /// ([`SqlArgument::derive`]: same context; the arguments of the tool call's own rewrite
    /// when its policies modified it), and the decision returned combines both: every
    /// violation (the tool call's first, then the statement's), the strongest verdict
    /// (`block` > `modify` > `warn` > `allow`; audit mode stays at `warn`), the signals of
    /// both (step 4 runs once, on the combination), and, when the verdict is `modify`, a
    /// `tool_call` rewrite whose SQL argument holds the rewritten statement. Every policy is
    /// told (step 5) whether the call executes, for both actions (so a `rate_limit` that counts
    /// both `tool_call` and `sql` actions counts such a call twice). The flight recorder gets two
    /// entries, each holding its own action and the decision of its own checks: first the
    /// `tool_call`, then the derived `sql` action (so the recorder's counts do not count a
    /// violation twice; the combined verdict is the stronger of the two entries'). A marked
    /// argument that is missing or not a string gets no SQL check: the call is judged as any
    /// other tool call (give the tool policy an argument constraint to refuse such shapes).
    ///
    /// # Errors
    /// Only errors of the flight recorder; the policies have already been told the outcome.
    pub fn check(&self, action: &Action) -> Result<Decision, GovError> {
        let started = Instant::now();
        let mark = self.sql_argument_for(action);
        let (own, subject, mut all_cached) = self.decide(action, mark.is_none());
        let sql_action = mark.and_then(|m| {
            let kind = own.effective_kind(&action.kind).unwrap_or(&action.kind);
            m.derive(kind, action)
        });
        let carried = sql_action.as_ref().map(|a| self.decide(a, false));
        let combined = match (mark, &carried) {
            (Some(m), Some((sql, _, _))) => {
                all_cached = false;
                Some(self.combine(m, action, &own, sql, true))
            }
            _ => None,
        };
        let executes = combined.as_ref().unwrap_or(&own).executes();
        let subjects = std::iter::once(&subject).chain(carried.as_ref().map(|c| &c.1));
        for subject in subjects {
            for entry in &self.policies {
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    entry.policy.record_outcome(subject, executes)
                }));
            }
        }
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.checks.fetch_add(1, Ordering::Relaxed);
        self.check_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.latency.record(nanos);
        // A policy told the outcome may have parsed the statement too.
        if all_cached && !subject.parsed() {
            self.cached_checks.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(rec) = &self.recorder {
            rec.append(action, &own)?;
            if let (Some(a), Some((d, _, _))) = (&sql_action, &carried) {
                rec.append(a, d)?;
            }
        }
        Ok(combined.unwrap_or(own))
    }

    /// What [`Kernel::check`] would decide for `action` now, without any effect: no policy is
    /// told an outcome (budgets, call counts and rate windows do not move), no signal state
    /// changes (the decision carries the findings' own signals only), and nothing is
    /// recorded. For gating partial output (the LLM gateway checks the text it is about to
    /// stream with this, and checks the whole response with [`Kernel::check`] once). A tool
    /// call that carries SQL is combined with its statement as [`Kernel::check`] does.
    pub fn preview(&self, action: &Action) -> Decision {
        let own = self.decide(action, false).0;
        let Some(mark) = self.sql_argument_for(action) else {
            return own;
        };
        let kind = own.effective_kind(&action.kind).unwrap_or(&action.kind);
        match mark.derive(kind, action) {
            Some(sql_action) => {
                let sql = self.decide(&sql_action, false).0;
                self.combine(mark, action, &own, &sql, false)
            }
            None => own,
        }
    }

    /// The first declared [`SqlArgument`] that applies to `action` (a tool call).
    fn sql_argument_for(&self, action: &Action) -> Option<&SqlArgument> {
        let ActionKind::ToolCall { name, arguments } = &action.kind else {
            return None;
        };
        self.sql_arguments
            .iter()
            .find(|m| m.applies(name, arguments))
    }

    /// The decision on a tool call (`own`) combined with that on the SQL it carries (`sql`);
    /// see [`Kernel::check`]. `stateful`: the signal step updates the stopped-agent set.
    fn combine(
        &self,
        mark: &SqlArgument,
        action: &Action,
        own: &Decision,
        sql: &Decision,
        stateful: bool,
    ) -> Decision {
        let rank = |v: Verdict| match v {
            Verdict::Allow => 0,
            Verdict::Warn => 1,
            Verdict::Modify => 2,
            Verdict::Block => 3,
        };
        let verdict = if rank(sql.verdict) > rank(own.verdict) {
            sql.verdict
        } else {
            own.verdict
        };
        let mut violations = own.violations.clone();
        violations.extend(sql.violations.iter().cloned());
        let rewritten = match verdict {
            Verdict::Modify => {
                let base = match &own.rewritten {
                    Some(k @ ActionKind::ToolCall { .. }) => k.clone(),
                    _ => action.kind.clone(),
                };
                match (base, &sql.rewritten) {
                    (
                        ActionKind::ToolCall { name, arguments },
                        Some(ActionKind::Sql { sql: rewritten, .. }),
                    ) => Some(ActionKind::ToolCall {
                        name,
                        arguments: mark.put_back(arguments, rewritten),
                    }),
                    (base, _) => Some(base),
                }
            }
            _ => None,
        };
        let signals = if self.mode == GovernanceMode::Enforce {
            self.signals(action, verdict, &violations, stateful)
        } else {
            Vec::new()
        };
        Decision {
            verdict,
            mode: self.mode,
            violations,
            rewritten,
            signals,
        }
    }

    /// The findings of the policy at `index` on `subject`, from the cache (through `memo`,
    /// the subject's record) when the policy is pure for a SQL action; the flag is `false`
    /// when a pure policy had to run (a miss) or there is no cache.
    fn findings(
        &self,
        index: usize,
        entry: &Entry,
        subject: &Subject<'_>,
        memo: Option<&mut Memo<'_>>,
    ) -> (Vec<Finding>, bool) {
        let run = || match catch_unwind(AssertUnwindSafe(|| entry.policy.check(subject))) {
            Ok(Ok(findings)) => Ok(findings),
            Ok(Err(e)) => Err(vec![Finding::block(
                FAIL_CLOSED_SEVERITY,
                format!("policy error, failing closed: {e}"),
            )]),
            Err(_) => Err(vec![Finding::block(
                FAIL_CLOSED_SEVERITY,
                "policy panicked, failing closed",
            )]),
        };
        let Some(memo) = memo else {
            return (run().unwrap_or_else(|failed| failed), false);
        };
        if !entry.policy.is_pure(&subject.action().kind) {
            return (run().unwrap_or_else(|failed| failed), true);
        }
        let position = u32::try_from(index).unwrap_or(u32::MAX);
        if let Some(found) = memo.get(position) {
            return (found.to_vec(), true);
        }
        match run() {
            Ok(findings) => {
                memo.learn(position, &findings);
                (findings, false)
            }
            Err(failed) => (failed, false),
        }
    }

    /// The cache record of `subject`'s statement: `None` without a cache or for a non-SQL
    /// action.
    fn memo<'s>(&'s self, subject: &'s Subject<'_>) -> Option<Memo<'s>> {
        let (cache, version) = self.cache.as_ref()?;
        match &subject.action().kind {
            ActionKind::Sql {
                database,
                sql,
                dialect,
            } => Some(Memo::new(
                cache,
                StatementRef {
                    version: *version,
                    dialect: *dialect,
                    database,
                    sql,
                },
                self.policies.len(),
            )),
            _ => None,
        }
    }

    /// Steps 1-4 of [`Kernel::check`]; `stateful` lets the signal step update the
    /// stopped-agent set. The flag says whether every pure policy's findings came from the
    /// cache and nothing parsed a rewritten-away statement (the returned subject's own parse
    /// is for the caller to look at, after the outcome step).
    fn decide<'a>(&'a self, action: &'a Action, stateful: bool) -> (Decision, Subject<'a>, bool) {
        let enforce = self.mode == GovernanceMode::Enforce;
        let mut violations = Vec::new();
        let mut rewritten: Option<ActionKind> = None;
        let mut all_cached = self.cache.is_some() && matches!(action.kind, ActionKind::Sql { .. });
        let mut index = 0;
        let mut current: Cow<'a, Action> = Cow::Borrowed(action);
        // One segment per subject: a rewrite (enforce mode) ends it, and the policies after
        // the rewriting one see the rewritten action.
        let subject = loop {
            let subject = Subject::of(current);
            let mut memo = self.memo(&subject);
            let mut next: Option<Action> = None;
            while let (None, Some(entry)) = (&next, self.policies.get(index)) {
                let (findings, cached) = self.findings(index, entry, &subject, memo.as_mut());
                all_cached &= cached;
                for finding in findings {
                    let mut finding = entry.options.apply(finding);
                    if let (true, Effect::Modify, Some(kind)) =
                        (enforce, finding.effect, finding.rewrite.take())
                    {
                        next = Some(Action {
                            context: subject.action().context.clone(),
                            kind: kind.clone(),
                        });
                        rewritten = Some(kind);
                    }
                    violations.push(Violation::from_finding(&entry.name, &finding));
                }
                index += 1;
            }
            if let Some(m) = memo {
                m.finish();
            }
            match next {
                Some(a) => {
                    // The rewrite is parsed anew if a later policy needs it.
                    all_cached &= !subject.parsed();
                    current = Cow::Owned(a);
                }
                None => break subject,
            }
        };
        let verdict = if violations.is_empty() {
            Verdict::Allow
        } else if !enforce {
            Verdict::Warn
        } else if violations.iter().any(Violation::blocked) {
            Verdict::Block
        } else if rewritten.is_some() {
            Verdict::Modify
        } else {
            Verdict::Warn
        };
        if verdict != Verdict::Modify {
            rewritten = None;
        }
        let signals = if enforce {
            self.signals(action, verdict, &violations, stateful)
        } else {
            Vec::new()
        };
        let decision = Decision {
            verdict,
            mode: self.mode,
            violations,
            rewritten,
            signals,
        };
        (decision, subject, all_cached)
    }

    /// Tells every policy that `rollout_id` is finished, so per-rollout state (budgets, call
    /// counts, a pending `SIGSTOP`) does not accumulate over a long run. Runners call it once
    /// per rollout, after its last action.
    pub fn end_rollout(&self, rollout_id: &str) {
        for entry in &self.policies {
            let _ = catch_unwind(AssertUnwindSafe(|| entry.policy.end_rollout(rollout_id)));
        }
        self.stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(rollout_id);
    }

    /// Forgets all policy state ([`Policy::reset`] on every policy) and every pending
    /// `SIGSTOP`. The policies and the recorder (whose chain is never reset) stay.
    pub fn reset(&self) {
        for entry in &self.policies {
            let _ = catch_unwind(AssertUnwindSafe(|| entry.policy.reset()));
        }
        self.stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The decision's signals; `stateful` also applies the `SIGSTOP`/`SIGCONT` bookkeeping.
    fn signals(
        &self,
        action: &Action,
        verdict: Verdict,
        violations: &[Violation],
        stateful: bool,
    ) -> Vec<Signal> {
        let mut out: Vec<Signal> = Vec::new();
        for s in violations.iter().filter_map(|v| v.signal) {
            if !out.contains(&s) {
                out.push(s);
            }
        }
        if !stateful {
            return out;
        }
        let ctx = &action.context;
        let Some(key) = ctx.agent_id.as_ref().or(ctx.rollout_id.as_ref()) else {
            return out;
        };
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if out.contains(&Signal::Sigstop) {
            stopped.insert(key.clone());
        } else if out.contains(&Signal::Sigkill) {
            stopped.remove(key);
        } else if verdict != Verdict::Block && stopped.remove(key) {
            out.push(Signal::Sigcont);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Returns fixed findings and remembers what it saw and was told.
    struct Fixed {
        name: &'static str,
        findings: Vec<Finding>,
        seen: Mutex<Vec<ActionKind>>,
        outcomes: Mutex<Vec<(ActionKind, bool)>>,
    }

    impl Policy for Arc<Fixed> {
        fn name(&self) -> &str {
            self.name
        }
        fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
            self.seen
                .lock()
                .unwrap()
                .push(subject.action().kind.clone());
            Ok(self.findings.clone())
        }
        fn record_outcome(&self, subject: &Subject<'_>, executed: bool) {
            self.outcomes
                .lock()
                .unwrap()
                .push((subject.action().kind.clone(), executed));
        }
    }

    fn fixed(name: &'static str, findings: Vec<Finding>) -> Arc<Fixed> {
        Arc::new(Fixed {
            name,
            findings,
            seen: Mutex::new(Vec::new()),
            outcomes: Mutex::new(Vec::new()),
        })
    }

    struct Failing(bool);

    impl Policy for Failing {
        fn name(&self) -> &str {
            "failing"
        }
        #[allow(clippy::panic)]
        fn check(&self, _subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
            if self.0 {
                panic!("boom");
            }
            Err(GovError::PolicyFailed {
                policy: "failing".into(),
                message: "backend unreachable".into(),
            })
        }
    }

    #[test]
    fn preview_decides_like_check_but_changes_and_records_nothing() {
        let p = fixed(
            "p",
            vec![Finding::block(Severity::High, "no").with_signal(Signal::Sigstop)],
        );
        let kernel = Kernel::new(GovernanceMode::Enforce)
            .with_policy(p.clone())
            .with_recorder(FlightRecorder::in_memory());
        let action = Action::output("hi").with_rollout_id("ro-1");
        let previewed = kernel.preview(&action);
        assert_eq!(previewed.verdict, Verdict::Block);
        assert_eq!(previewed.signals, vec![Signal::Sigstop]);
        assert!(p.outcomes.lock().unwrap().is_empty(), "no outcome told");
        assert_eq!(kernel.recorder().map(FlightRecorder::entries), Some(0));
        let checked = kernel.check(&action).unwrap();
        assert_eq!(checked.verdict, previewed.verdict);
        assert_eq!(checked.violations, previewed.violations);
        assert_eq!(p.outcomes.lock().unwrap().len(), 1);
        assert_eq!(kernel.recorder().map(FlightRecorder::entries), Some(1));
    }

    fn limited() -> ActionKind {
        ActionKind::Sql {
            database: "db".into(),
            sql: "SELECT 1 LIMIT 10".into(),
            dialect: Default::default(),
        }
    }

    #[test]
    fn kernel_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Kernel>();
    }

    #[test]
    fn empty_kernel_allows_everything() {
        let k = Kernel::new(GovernanceMode::Enforce);
        let d = k.check(&Action::sql("db", "DROP TABLE x")).unwrap();
        assert_eq!(d.verdict, Verdict::Allow);
        assert!(k.policy_names().is_empty());
        assert!(k.recorder().is_none());
    }

    #[test]
    fn block_wins_then_modify_then_warn_in_enforce_and_audit_only_warns() {
        let warn = Finding::warn(Severity::Low, "w");
        let modify = Finding::modify(Severity::Low, "m", limited());
        let block = Finding::block(Severity::High, "b");
        let cases = [
            (vec![], Verdict::Allow, Verdict::Allow),
            (vec![warn.clone()], Verdict::Warn, Verdict::Warn),
            (
                vec![warn.clone(), modify.clone()],
                Verdict::Modify,
                Verdict::Warn,
            ),
            (
                vec![modify.clone(), block.clone(), warn.clone()],
                Verdict::Block,
                Verdict::Warn,
            ),
        ];
        for (findings, enforce, audit) in cases {
            for (mode, expected) in [
                (GovernanceMode::Enforce, enforce),
                (GovernanceMode::Audit, audit),
            ] {
                let k = Kernel::new(mode).with_policy(fixed("p", findings.clone()));
                let d = k.check(&Action::sql("db", "SELECT 1")).unwrap();
                assert_eq!(d.verdict, expected, "mode {mode} findings {findings:?}");
                assert_eq!(d.mode, mode);
                assert_eq!(d.rewritten.is_some(), expected == Verdict::Modify);
                // effects are kept as found in both modes
                let effects: Vec<Effect> = d.violations.iter().map(|v| v.effect).collect();
                let want: Vec<Effect> = findings.iter().map(|f| f.effect).collect();
                assert_eq!(effects, want);
            }
        }
    }

    #[test]
    fn a_rewrite_is_what_later_policies_see_and_what_executes() {
        let a = fixed(
            "a",
            vec![Finding::modify(Severity::Low, "limit", limited())],
        );
        let b = fixed("b", vec![]);
        let k = Kernel::new(GovernanceMode::Enforce)
            .with_policy(Arc::clone(&a))
            .with_policy(Arc::clone(&b));
        let original = Action::sql("db", "SELECT 1");
        let d = k.check(&original).unwrap();
        assert_eq!(d.verdict, Verdict::Modify);
        assert_eq!(d.rewritten, Some(limited()));
        assert_eq!(d.effective_kind(&original.kind), Some(&limited()));
        assert_eq!(*a.seen.lock().unwrap(), vec![original.kind.clone()]);
        assert_eq!(*b.seen.lock().unwrap(), vec![limited()]);
        assert_eq!(*b.outcomes.lock().unwrap(), vec![(limited(), true)]);
    }

    #[test]
    fn erroring_or_panicking_policies_fail_closed_and_say_so() {
        for panics in [false, true] {
            let k = Kernel::new(GovernanceMode::Enforce).with_policy(Failing(panics));
            let d = k.check(&Action::sql("db", "SELECT 1")).unwrap();
            assert_eq!(d.verdict, Verdict::Block);
            let v = &d.violations[0];
            assert_eq!(v.policy, "failing");
            assert_eq!(v.severity, FAIL_CLOSED_SEVERITY);
            assert!(v.reason.contains("failing closed"), "{}", v.reason);
            if !panics {
                assert!(v.reason.contains("backend unreachable"));
            }
        }
    }

    #[test]
    fn options_override_name_severity_penalty_effect_and_signal() {
        let p = fixed("p", vec![Finding::block(Severity::Critical, "x")]);
        let options = PolicyOptions {
            name: Some("observer".into()),
            severity: Some(Severity::Low),
            penalty: Some(0.5),
            effect: Some(Effect::Warn),
            signal: Some(Signal::Sigkill),
        };
        let k = Kernel::new(GovernanceMode::Enforce).with_policy_options(p, options);
        assert_eq!(k.policy_names(), vec!["observer"]);
        let d = k.check(&Action::sql("db", "x")).unwrap();
        assert_eq!(d.verdict, Verdict::Warn);
        let v = &d.violations[0];
        assert_eq!(
            (v.policy.as_str(), v.severity, v.penalty, v.effect, v.signal),
            (
                "observer",
                Severity::Low,
                Some(0.5),
                Effect::Warn,
                Some(Signal::Sigkill)
            )
        );
        assert_eq!(d.signals, vec![Signal::Sigkill]);
        // a modify effect forced onto a finding without a rewrite acts as warn
        let q = fixed("q", vec![Finding::warn(Severity::Low, "y")]);
        let k = Kernel::new(GovernanceMode::Enforce).with_policy_options(
            q,
            PolicyOptions {
                effect: Some(Effect::Modify),
                ..PolicyOptions::default()
            },
        );
        let d = k.check(&Action::sql("db", "x")).unwrap();
        assert_eq!(
            (d.verdict, d.violations[0].effect),
            (Verdict::Warn, Effect::Warn)
        );
    }

    #[test]
    fn sigstop_is_followed_by_sigcont_on_the_next_unblocked_decision() {
        struct StopFirst(Mutex<u32>);
        impl Policy for StopFirst {
            fn name(&self) -> &str {
                "rate"
            }
            fn check(&self, _s: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
                let mut n = self.0.lock().unwrap();
                *n += 1;
                Ok(if *n == 1 {
                    vec![Finding::block(Severity::Medium, "too fast").with_signal(Signal::Sigstop)]
                } else {
                    vec![]
                })
            }
        }
        let k = Kernel::new(GovernanceMode::Enforce).with_policy(StopFirst(Mutex::new(0)));
        let act = Action::sql("db", "SELECT 1").with_agent_id("agent-1");
        assert_eq!(k.check(&act).unwrap().signals, vec![Signal::Sigstop]);
        assert_eq!(k.check(&act).unwrap().signals, vec![Signal::Sigcont]);
        assert!(k.check(&act).unwrap().signals.is_empty());
        // audit mode sends nothing
        let k = Kernel::new(GovernanceMode::Audit).with_policy(StopFirst(Mutex::new(0)));
        let d = k.check(&act).unwrap();
        assert!(d.signals.is_empty());
        assert_eq!(d.violations[0].signal, Some(Signal::Sigstop));
    }

    #[test]
    fn every_policy_is_told_whether_the_action_executes() {
        for (mode, executed) in [
            (GovernanceMode::Enforce, false),
            (GovernanceMode::Audit, true),
        ] {
            let a = fixed("a", vec![]);
            let b = fixed("b", vec![Finding::block(Severity::Critical, "no")]);
            let k = Kernel::new(mode)
                .with_policy(Arc::clone(&a))
                .with_policy(Arc::clone(&b));
            assert_eq!(k.policy_names(), vec!["a", "b"]);
            let act = Action::sql("db", "x");
            let d = k.check(&act).unwrap();
            assert_eq!(d.executes(), executed);
            assert_eq!(
                *a.outcomes.lock().unwrap(),
                vec![(act.kind.clone(), executed)]
            );
            assert_eq!(
                *b.outcomes.lock().unwrap(),
                vec![(act.kind.clone(), executed)]
            );
        }
    }

    /// A [`Fixed`] that declares itself pure for SQL.
    struct Pure(Arc<Fixed>);

    impl Policy for Pure {
        fn name(&self) -> &str {
            self.0.name
        }
        fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
            // Pure policies may parse: the parse comes from the cache too.
            let _ = subject.sql();
            self.0.check(subject)
        }
        fn is_pure(&self, kind: &ActionKind) -> bool {
            matches!(kind, ActionKind::Sql { .. })
        }
        fn record_outcome(&self, subject: &Subject<'_>, executed: bool) {
            self.0.record_outcome(subject, executed)
        }
    }

    #[test]
    fn the_cache_skips_pure_checks_but_every_policy_sees_every_outcome() {
        let pure = fixed("pure", vec![Finding::warn(Severity::Low, "wide")]);
        let stateful = fixed("stateful", vec![]);
        let cache = Arc::new(CheckCache::default());
        let rec = Arc::new(FlightRecorder::in_memory());
        let k = Kernel::new(GovernanceMode::Enforce)
            .with_policy(Pure(Arc::clone(&pure)))
            .with_policy(Arc::clone(&stateful))
            .with_check_cache(cache.clone())
            .with_shared_recorder(rec.clone());
        let select = Action::sql("db", "SELECT * FROM t");
        let other_db = Action::sql("other", "SELECT * FROM t");
        let mut decisions = Vec::new();
        for a in [&select, &select, &other_db, &select] {
            decisions.push(k.check(a).unwrap());
        }
        // The pure policy ran once per (database, statement); the stateful one every time.
        assert_eq!(pure.seen.lock().unwrap().len(), 2);
        assert_eq!(stateful.seen.lock().unwrap().len(), 4);
        assert_eq!(pure.outcomes.lock().unwrap().len(), 4);
        assert_eq!(stateful.outcomes.lock().unwrap().len(), 4);
        // Cached findings decide exactly as computed ones.
        assert!(decisions.iter().all(|d| d == &decisions[0]));
        assert_eq!(decisions[0].verdict, Verdict::Warn);
        assert_eq!(rec.entries(), 4, "every check is recorded");
        let stats = k.stats();
        assert_eq!((stats.checks, stats.cached_checks), (4, 2));
        assert!((stats.hit_rate - 0.5).abs() < 1e-12);
        assert!(stats.check_seconds > 0.0 && stats.mean_check_us > 0.0);
        assert!((stats.checks_per_second * stats.check_seconds - 4.0).abs() < 1e-6);
        let c = cache.stats();
        assert_eq!((c.verdict_hits, c.verdict_misses), (2, 2));
        // Tool calls are never cached.
        let tool = Action::tool_call("search", serde_json::json!({}));
        k.check(&tool).unwrap();
        k.check(&tool).unwrap();
        assert_eq!(pure.seen.lock().unwrap().len(), 4);
        assert_eq!(k.stats().cached_checks, 2);
    }

    fn sql_tool_kernel(mode: GovernanceMode, config: crate::SqlPolicyConfig) -> Kernel {
        Kernel::new(mode)
            .with_policy(crate::SqlPolicy::new(config))
            .with_policy(
                crate::ToolPolicy::new(crate::ToolPolicyConfig {
                    deny: vec!["shell".into()],
                    ..crate::ToolPolicyConfig::default()
                })
                .unwrap(),
            )
            .with_sql_argument(SqlArgument::new("run_sql", "query").with_database_argument("db_id"))
            .with_recorder(FlightRecorder::in_memory())
    }

    fn run_sql(query: &str) -> Action {
        Action::tool_call(
            "run_sql",
            serde_json::json!({"query": query, "db_id": "concert_singer"}),
        )
        .with_rollout_id("ro-1")
    }

    #[test]
    fn sql_in_a_marked_tool_argument_is_checked_by_the_sql_policies() {
        let k = sql_tool_kernel(GovernanceMode::Enforce, crate::SqlPolicyConfig::default());
        let d = k.check(&run_sql("DROP TABLE singer")).unwrap();
        assert_eq!(d.verdict, Verdict::Block);
        assert_eq!(d.policies(), vec!["sql_safety"]);
        assert!(d.violations.iter().all(Violation::blocked), "{d:?}");
        // The same statement as an unmarked tool's argument is not SQL to the kernel.
        let other = Action::tool_call("search", serde_json::json!({"query": "DROP TABLE singer"}));
        assert_eq!(k.check(&other).unwrap().verdict, Verdict::Allow);
        // A marked argument that is not a string: no SQL check.
        let shape = Action::tool_call("run_sql", serde_json::json!({"query": ["DROP TABLE x"]}));
        assert_eq!(k.check(&shape).unwrap().verdict, Verdict::Allow);
        let d = k.check(&run_sql("SELECT name FROM singer")).unwrap();
        assert_eq!(d.verdict, Verdict::Allow, "{d:?}");
        assert_eq!(
            k.preview(&run_sql("DROP TABLE singer")).verdict,
            Verdict::Block
        );
        // Recorder: the DROP call gave two entries (the tool call with its own decision, then
        // the derived statement, blocked, with the call's context); the other checks one or
        // two each; preview none.
        let rec = k.recorder().unwrap();
        let page = rec.query(&crate::Query::default()).unwrap();
        let kinds: Vec<(&str, Verdict)> = page
            .entries
            .iter()
            .map(|e| (e.action_type.as_str(), e.verdict))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("tool_call", Verdict::Allow),
                ("sql", Verdict::Block),
                ("tool_call", Verdict::Allow),
                ("tool_call", Verdict::Allow),
                ("tool_call", Verdict::Allow),
                ("sql", Verdict::Allow),
            ]
        );
        let sql = &page.entries[1];
        assert_eq!(sql.rollout_id.as_deref(), Some("ro-1"));
        assert_eq!(
            sql.action.kind,
            ActionKind::Sql {
                database: "concert_singer".into(),
                sql: "DROP TABLE singer".into(),
                dialect: Default::default(),
            }
        );
        assert!(rec.verify_chain().unwrap().first_broken.is_none());
    }

    #[test]
    fn a_marked_call_combines_both_decisions() {
        // Audit: the DROP is reported as found, the call passes.
        let k = sql_tool_kernel(GovernanceMode::Audit, crate::SqlPolicyConfig::default());
        let d = k.check(&run_sql("DROP TABLE singer")).unwrap();
        assert_eq!(d.verdict, Verdict::Warn);
        assert!(d.violations.iter().any(Violation::blocked));
        assert!(d.executes() && d.rewritten.is_none());
        // Enforce with a row limit: the rewritten statement goes back into the arguments.
        let config = crate::SqlPolicyConfig {
            max_rows: Some(5),
            ..crate::SqlPolicyConfig::default()
        };
        let k = sql_tool_kernel(GovernanceMode::Enforce, config);
        let d = k.check(&run_sql("SELECT name FROM singer")).unwrap();
        assert_eq!(d.verdict, Verdict::Modify, "{d:?}");
        let Some(ActionKind::ToolCall { name, arguments }) = &d.rewritten else {
            panic!("{d:?}");
        };
        assert_eq!(name, "run_sql");
        assert_eq!(arguments["db_id"], "concert_singer");
        let q = arguments["query"].as_str().unwrap();
        assert!(q.contains("LIMIT 5"), "{q}");
        // Violations of both: a denied tool name marked as SQL carrier, with a DROP.
        let k = Kernel::new(GovernanceMode::Enforce)
            .with_policy(crate::SqlPolicy::new(crate::SqlPolicyConfig::default()))
            .with_policy(
                crate::ToolPolicy::new(crate::ToolPolicyConfig {
                    deny: vec!["run_sql".into()],
                    ..crate::ToolPolicyConfig::default()
                })
                .unwrap(),
            )
            .with_sql_argument(SqlArgument::new("run_sql", "query"));
        let d = k.check(&run_sql("DROP TABLE singer")).unwrap();
        assert_eq!(d.verdict, Verdict::Block);
        assert_eq!(d.policies(), vec!["tool_policy", "sql_safety"]);
    }

    #[test]
    fn latency_quantiles_are_within_a_bucket() {
        let h = Latency::new();
        for ns in 1..=10_000u64 {
            h.record(ns * 100);
        }
        // True median 500 µs, p99 990 µs; buckets are 12.5% wide.
        let (p50, p99) = (h.quantile_us(0.5), h.quantile_us(0.99));
        assert!((437.5..=500.0).contains(&p50), "{p50}");
        assert!((866.0..=990.0).contains(&p99), "{p99}");
        for ns in [0u64, 7, 8, 9, 1 << 20, u64::MAX] {
            let i = Latency::index(ns);
            assert!(Latency::lower(i) <= ns, "{ns}");
            assert!(i < Latency::BUCKETS);
        }
        assert_eq!(Latency::new().quantile_us(0.5), 0.0);
    }

    #[test]
    fn kernels_assembled_by_hand_do_not_share_findings() {
        let cache = Arc::new(CheckCache::default());
        let strict = fixed("p", vec![Finding::block(Severity::High, "no")]);
        let lax = fixed("p", vec![]);
        let k1 = Kernel::new(GovernanceMode::Enforce)
            .with_policy(Pure(strict))
            .with_check_cache(cache.clone());
        let k2 = Kernel::new(GovernanceMode::Enforce)
            .with_policy(Pure(Arc::clone(&lax)))
            .with_check_cache(cache);
        let a = Action::sql("db", "SELECT 1");
        assert_eq!(k1.check(&a).unwrap().verdict, Verdict::Block);
        assert_eq!(k2.check(&a).unwrap().verdict, Verdict::Allow);
        assert_eq!(lax.seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn failing_pure_policies_are_not_cached() {
        struct PureFailing(AtomicU64);
        impl Policy for PureFailing {
            fn name(&self) -> &str {
                "failing"
            }
            fn check(&self, _subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
                self.0.fetch_add(1, Ordering::Relaxed);
                Err(GovError::PolicyFailed {
                    policy: "failing".into(),
                    message: "cannot decide".into(),
                })
            }
            fn is_pure(&self, _kind: &ActionKind) -> bool {
                true
            }
        }
        let calls = Arc::new(PureFailing(AtomicU64::new(0)));
        struct Shared(Arc<PureFailing>);
        impl Policy for Shared {
            fn name(&self) -> &str {
                self.0.name()
            }
            fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
                self.0.check(subject)
            }
            fn is_pure(&self, kind: &ActionKind) -> bool {
                self.0.is_pure(kind)
            }
        }
        let k = Kernel::new(GovernanceMode::Enforce)
            .with_policy(Shared(Arc::clone(&calls)))
            .with_check_cache(Arc::new(CheckCache::default()));
        let a = Action::sql("db", "SELECT 1");
        for _ in 0..3 {
            let d = k.check(&a).unwrap();
            assert_eq!(d.verdict, Verdict::Block, "fails closed every time");
        }
        assert_eq!(calls.0.load(Ordering::Relaxed), 3);
        assert_eq!(k.stats().cached_checks, 0);
    }
}
