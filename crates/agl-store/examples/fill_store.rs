//! Fills a SQLite store with a realistic training history, for measuring the dashboard and the
//! store at scale (100,000 rollouts and 1,000,000 spans by default).
//!
//! ```text
//! cargo run --release -p agl-store --example fill_store -- PATH \
//!     [--rollouts 100000] [--spans-per-rollout 10] [--batch 1000] [--seed 7]
//! ```
//!
//! Everything goes through the public [`SqliteLightningStore`] API, the way a trainer and its
//! runners use it: resources `policy-v1` … `policy-v50` published as training advances;
//! rollouts enqueued in batches (`enqueue_many`; `train` and `val` modes, Spider-like inputs,
//! half of them allowed a retry on failure); runners `runner-0` … `runner-15` dequeue them
//! (`dequeue_many`), move their attempts to `running`, send their spans in batches
//! (`add_spans`: the rollout's root operation, LLM calls with prompts, completions, token
//! counts and token ids, tool calls, the `sql.query` operation with its verdict, governance
//! violations, the reward annotation) and finish them. At the end most rollouts have
//! `succeeded`, some `failed` or were `cancelled`, and some are still `queuing`, `requeuing`,
//! `preparing` or `running`. The file must not exist yet or be an agl store (rollouts are
//! added to what it holds). Prints the time taken, the store's statistics and the file size.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use agl_core::{
    AttemptStatus, AttemptedRollout, AttributeValue, Attributes, EnqueueRolloutRequest,
    NamedResources, RolloutConfig, RolloutMode, RolloutStatus, Span, SpanStatus, StatusCode,
    semconv,
};
use agl_store::{AttemptUpdate, LightningStore, RolloutUpdate, SqliteLightningStore};
use serde_json::{Map, Value, json};
use tokio::task::JoinSet;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Command-line options.
struct Args {
    path: PathBuf,
    rollouts: usize,
    spans_per_rollout: usize,
    batch: usize,
    seed: u64,
}

const USAGE: &str = "usage: fill_store PATH [--rollouts N] [--spans-per-rollout N] \
                     [--batch N] [--seed N]";

fn args() -> Res<Args> {
    let mut path = None;
    let mut out = Args {
        path: PathBuf::new(),
        rollouts: 100_000,
        spans_per_rollout: 10,
        batch: 1_000,
        seed: 7,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Res<u64> {
            let v = it
                .next()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))?;
            Ok(v.parse().map_err(|e| format!("{name} {v}: {e}\n{USAGE}"))?)
        };
        match a.as_str() {
            "--rollouts" => out.rollouts = usize::try_from(number(&a)?)?,
            "--spans-per-rollout" => out.spans_per_rollout = usize::try_from(number(&a)?)?,
            "--batch" => out.batch = usize::try_from(number(&a)?)?.max(1),
            "--seed" => out.seed = number(&a)?,
            "-h" | "--help" => return Err(USAGE.into()),
            p if path.is_none() && !p.starts_with("--") => path = Some(PathBuf::from(p)),
            other => return Err(format!("unexpected argument `{other}`\n{USAGE}").into()),
        }
    }
    out.path = path.ok_or(USAGE)?;
    Ok(out)
}

/// A small deterministic generator (SplitMix64): the example needs no `rand`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

const DATABASES: &[(&str, &str)] = &[
    (
        "concert_singer",
        "CREATE TABLE singer (singer_id INT, name TEXT, country TEXT, age INT); \
         CREATE TABLE concert (concert_id INT, concert_name TEXT, stadium_id INT, year INT)",
    ),
    (
        "pets_1",
        "CREATE TABLE student (stuid INT, lname TEXT, fname TEXT, age INT, sex TEXT); \
         CREATE TABLE pets (petid INT, pettype TEXT, pet_age INT, weight REAL)",
    ),
    (
        "car_1",
        "CREATE TABLE cars_data (id INT, mpg TEXT, cylinders INT, horsepower TEXT, year INT); \
         CREATE TABLE car_makers (id INT, maker TEXT, fullname TEXT, country TEXT)",
    ),
    (
        "flight_2",
        "CREATE TABLE airlines (uid INT, airline TEXT, abbreviation TEXT, country TEXT); \
         CREATE TABLE flights (airline INT, flightno INT, sourceairport TEXT, destairport TEXT)",
    ),
    (
        "employee_hire_evaluation",
        "CREATE TABLE employee (employee_id INT, name TEXT, age INT, city TEXT); \
         CREATE TABLE evaluation (employee_id TEXT, year_awarded TEXT, bonus REAL)",
    ),
    (
        "museum_visit",
        "CREATE TABLE museum (museum_id INT, name TEXT, num_of_staff INT, open_year TEXT); \
         CREATE TABLE visit (museum_id INT, visitor_id TEXT, num_of_ticket INT, total_spent REAL)",
    ),
];

const QUESTIONS: &[(&str, &str)] = &[
    (
        "How many rows are there in {t}?",
        "SELECT count(*) FROM {t}",
    ),
    (
        "List every name in {t}, ordered by name.",
        "SELECT name FROM {t} ORDER BY name",
    ),
    (
        "What is the average age in {t}?",
        "SELECT avg(age) FROM {t}",
    ),
    (
        "Show the distinct countries of {t}.",
        "SELECT DISTINCT country FROM {t}",
    ),
    (
        "Which entries of {t} were added after 2010?",
        "SELECT * FROM {t} WHERE year > 2010",
    ),
];

/// Statements that a governance policy stops, with the policy, severity, effect and reason.
const VIOLATIONS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "DROP TABLE {t}",
        "sql_safety",
        "critical",
        "block",
        "destructive statement: DROP TABLE",
    ),
    (
        "DELETE FROM {t}",
        "no_destructive_writes",
        "high",
        "block",
        "DELETE without WHERE",
    ),
    (
        "SELECT * FROM {t}",
        "row_limit",
        "medium",
        "modify",
        "unbounded SELECT: LIMIT 1000 added",
    ),
    (
        "UPDATE {t} SET age = 0",
        "no_destructive_writes",
        "high",
        "block",
        "UPDATE without WHERE",
    ),
];

/// What happens to one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Dequeued, never started (stays `preparing`).
    Preparing,
    /// Started, half its spans sent, never finished (stays `running`).
    Running,
    /// Finished `failed` (retried when the rollout allows it).
    Failed,
    /// Finished `succeeded`.
    Succeeded,
    /// Started, then the rollout was cancelled by the trainer.
    Cancelled,
}

fn fate(rng: &mut Rng) -> Fate {
    let x = rng.unit();
    if x < 0.010 {
        Fate::Preparing
    } else if x < 0.025 {
        Fate::Running
    } else if x < 0.030 {
        Fate::Cancelled
    } else if x < 0.120 {
        Fate::Failed
    } else {
        Fate::Succeeded
    }
}

fn attrs(pairs: &[(&str, AttributeValue)]) -> Attributes {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::Str(v.to_string())
}

fn tokens(rng: &mut Rng, n: usize) -> AttributeValue {
    AttributeValue::IntArray((0..n).map(|_| rng.below(151_000) as i64).collect())
}

/// The task an input names.
struct Task {
    db: usize,
    question: usize,
    table: &'static str,
}

fn task_of(input: &Value) -> Task {
    let n = input.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
    let db = n % DATABASES.len();
    let tables = [
        "singer",
        "pets",
        "cars_data",
        "flights",
        "employee",
        "museum",
    ];
    Task {
        db,
        question: (n / DATABASES.len()) % QUESTIONS.len(),
        table: tables[db],
    }
}

/// The spans of one attempt: the rollout's root operation, LLM calls alternating with tool
/// calls, the `sql.query` operation, a violation annotation when `violation`, and the reward
/// annotation; `n` spans in all (the middle is cut or padded). Without `finished` the reward
/// and the last half are missing (a runner still at work).
#[allow(clippy::too_many_arguments)]
fn attempt_spans(
    rng: &mut Rng,
    a: &AttemptedRollout,
    model: &str,
    n: usize,
    finished: bool,
    violation: bool,
    correct: bool,
) -> Vec<Span> {
    if n == 0 {
        return Vec::new();
    }
    let rid = &a.rollout.rollout_id;
    let aid = &a.attempt.attempt_id;
    let task = task_of(&a.rollout.input);
    let (db_id, schema) = DATABASES[task.db];
    let (question, gold) = QUESTIONS[task.question];
    let question = question.replace("{t}", task.table);
    let v = VIOLATIONS[rng.below(VIOLATIONS.len())];
    let sql = if violation {
        v.0.replace("{t}", task.table)
    } else if correct {
        gold.replace("{t}", task.table)
    } else {
        format!("SELECT name FROM {} WHERE age > 30", task.table)
    };
    // Kinds of spans, in order: root, then middle, then the closing ones.
    let mut closing = vec!["sql"];
    if violation {
        closing.push("violation");
    }
    closing.push("reward");
    let middle = n.saturating_sub(1 + closing.len()).max(1);
    let mut kinds = vec!["root"];
    kinds.extend((0..middle).map(|i| if i % 2 == 0 { "llm" } else { "tool" }));
    kinds.extend(closing);
    kinds.truncate(n);
    if !finished {
        kinds.truncate(n.div_ceil(2));
    }
    let t0 = a.attempt.start_time + rng.between(0.01, 0.2);
    let mut clock = t0;
    let mut spans = Vec::with_capacity(kinds.len());
    let mut root_id = String::new();
    let mut trace_id = String::new();
    for (i, kind) in kinds.iter().enumerate() {
        let seq = i as i64 + 1;
        let (name, attributes, seconds, error) = match *kind {
            "root" => (
                semconv::AGL_OPERATION,
                attrs(&[
                    (semconv::OPERATION_NAME, s("spider.rollout")),
                    (semconv::agl::DATABASE, s(db_id)),
                    (semconv::OPERATION_INPUT, s(&question)),
                ]),
                0.0,
                false,
            ),
            "llm" => {
                let prompt_tokens = 180 + rng.below(400);
                let completion_tokens = 12 + rng.below(60);
                (
                    semconv::OPENAI_CHAT_COMPLETION,
                    attrs(&[
                        (semconv::gen_ai::SYSTEM, s("openai")),
                        (semconv::gen_ai::REQUEST_MODEL, s(model)),
                        (semconv::gen_ai::RESPONSE_MODEL, s(model)),
                        (
                            semconv::gen_ai::REQUEST_TEMPERATURE,
                            AttributeValue::Float(0.7),
                        ),
                        ("gen_ai.prompt.0.role", s("system")),
                        (
                            "gen_ai.prompt.0.content",
                            s(&format!(
                                "You translate questions into SQLite SQL. Schema of \
                                 `{db_id}`: {schema}. Answer with one statement."
                            )),
                        ),
                        ("gen_ai.prompt.1.role", s("user")),
                        ("gen_ai.prompt.1.content", s(&question)),
                        ("gen_ai.completion.0.role", s("assistant")),
                        ("gen_ai.completion.0.content", s(&sql)),
                        (
                            semconv::gen_ai::USAGE_PROMPT_TOKENS,
                            AttributeValue::Int(prompt_tokens as i64),
                        ),
                        (
                            semconv::gen_ai::USAGE_COMPLETION_TOKENS,
                            AttributeValue::Int(completion_tokens as i64),
                        ),
                        ("prompt_token_ids", tokens(rng, 96)),
                        ("response_token_ids", tokens(rng, completion_tokens.min(48))),
                    ]),
                    rng.between(0.3, 2.5),
                    rng.chance(0.01),
                )
            }
            "tool" => (
                "tool.call",
                attrs(&[
                    ("tool.name", s("sql.schema")),
                    ("tool.arguments", s(&format!("{{\"db_id\": \"{db_id}\"}}"))),
                    ("tool.rows", AttributeValue::Int(rng.below(40) as i64)),
                ]),
                rng.between(0.005, 0.05),
                false,
            ),
            "sql" => (
                semconv::AGL_OPERATION,
                attrs(&[
                    (semconv::OPERATION_NAME, s("sql.query")),
                    (semconv::agl::SQL, s(&sql)),
                    (semconv::agl::DATABASE, s(db_id)),
                    (
                        semconv::agl::VERDICT,
                        s(if violation && v.3 == "block" {
                            "block"
                        } else {
                            "allow"
                        }),
                    ),
                    (
                        semconv::agl::EXECUTED,
                        AttributeValue::Bool(!(violation && v.3 == "block")),
                    ),
                    (
                        semconv::agl::ROWS_RETURNED,
                        AttributeValue::Int(rng.below(50) as i64),
                    ),
                    (semconv::agl::ROWS_CHANGED, AttributeValue::Int(0)),
                    (semconv::agl::SCHEMA_CHANGED, AttributeValue::Bool(false)),
                    (semconv::agl::DESTRUCTIVE, AttributeValue::Bool(violation)),
                    (
                        semconv::agl::CORRECT,
                        AttributeValue::Bool(correct && !violation),
                    ),
                ]),
                rng.between(0.002, 0.03),
                false,
            ),
            "violation" => (
                semconv::AGL_ANNOTATION,
                attrs(&[
                    (semconv::agent_os::VIOLATION_POLICY, s(v.1)),
                    (semconv::agent_os::VIOLATION_SEVERITY, s(v.2)),
                    (semconv::agent_os::VIOLATION_EFFECT, s(v.3)),
                    (semconv::agent_os::VIOLATION_REASON, s(v.4)),
                    (
                        semconv::agent_os::VIOLATION_BLOCKED,
                        AttributeValue::Bool(v.3 == "block"),
                    ),
                    (semconv::agent_os::ACTION_TYPE, s("sql.query")),
                ]),
                0.0,
                false,
            ),
            _ => {
                let base = if correct && !violation { 1.0 } else { 0.0 };
                let penalty = if violation { -0.5 } else { 0.0 };
                (
                    semconv::AGL_ANNOTATION,
                    attrs(&[
                        ("agentlightning.reward.0.name", s("final")),
                        (
                            "agentlightning.reward.0.value",
                            AttributeValue::Float(base + penalty),
                        ),
                        ("agentlightning.reward.1.name", s("base")),
                        ("agentlightning.reward.1.value", AttributeValue::Float(base)),
                        ("agentlightning.reward.2.name", s("policy_penalty")),
                        (
                            "agentlightning.reward.2.value",
                            AttributeValue::Float(penalty),
                        ),
                        (
                            semconv::agent_os::VIOLATION_COUNT,
                            AttributeValue::Int(i64::from(violation)),
                        ),
                        (
                            semconv::agent_os::POLICY_COMPLIANT,
                            AttributeValue::Bool(!violation),
                        ),
                    ]),
                    0.0,
                    false,
                )
            }
        };
        let mut span = Span::new(rid.as_str(), aid.as_str(), seq, name, attributes);
        if i == 0 {
            root_id.clone_from(&span.span_id);
            trace_id.clone_from(&span.trace_id);
        } else {
            span.trace_id.clone_from(&trace_id);
            if let Some(c) = span.context.as_mut() {
                c.trace_id.clone_from(&trace_id);
            }
            span.parent_id = Some(root_id.clone());
        }
        span.start_time = Some(clock);
        clock += seconds;
        span.end_time = Some(clock);
        if error {
            span.status = SpanStatus {
                description: Some("rate limited (HTTP 429)".into()),
                ..SpanStatus::new(StatusCode::Error)
            };
        }
        spans.push(span);
    }
    // The root spans the whole attempt.
    if let Some(root) = spans.first_mut() {
        root.end_time = Some(clock);
    }
    spans
}

fn resources(version: usize) -> Res<NamedResources> {
    Ok(serde_json::from_value(json!({
        "main_llm": {
            "resource_type": "llm",
            "endpoint": "http://127.0.0.1:8000/v1",
            "model": format!("policy-v{version}"),
            "sampling_parameters": {"temperature": 0.7}
        },
        "system_prompt": {
            "resource_type": "prompt_template",
            "template": "You translate questions into SQLite SQL. Schema: {schema}",
            "engine": "f-string"
        }
    }))?)
}

fn request(rng: &mut Rng, index: usize, version: usize, epoch: usize) -> EnqueueRolloutRequest {
    let val = rng.chance(0.2);
    let mut metadata = Map::new();
    metadata.insert("epoch".into(), json!(epoch));
    metadata.insert("policy_version".into(), json!(version));
    metadata.insert("split".into(), json!(if val { "dev" } else { "train" }));
    let retry = rng.chance(0.5);
    EnqueueRolloutRequest {
        input: json!({"index": index, "db_id": DATABASES[index % DATABASES.len()].0}),
        mode: Some(if val {
            RolloutMode::Val
        } else {
            RolloutMode::Train
        }),
        resources_id: Some(format!("policy-v{version}")),
        config: Some(RolloutConfig {
            max_attempts: if retry { 2 } else { 1 },
            retry_condition: if retry {
                vec![AttemptStatus::Failed]
            } else {
                Vec::new()
            },
            ..RolloutConfig::default()
        }),
        metadata: Some(metadata),
    }
}

fn status(s: AttemptStatus) -> AttemptUpdate {
    AttemptUpdate {
        status: Some(s),
        ..AttemptUpdate::default()
    }
}

/// Runs `updates` concurrently (the store commits concurrent calls together).
async fn update_all(
    store: &Arc<SqliteLightningStore>,
    updates: Vec<(String, String, AttemptStatus)>,
) -> Res<()> {
    let mut set = JoinSet::new();
    for (rid, aid, st) in updates {
        let store = Arc::clone(store);
        set.spawn(async move { store.update_attempt(&rid, &aid, status(st)).await });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// Counts of what the generator did.
#[derive(Default)]
struct Tally {
    attempts: usize,
    spans: usize,
}

/// Dequeues everything dispatchable (runners take 64 at a time) and plays each attempt's fate.
async fn play_round(
    store: &Arc<SqliteLightningStore>,
    rng: &mut Rng,
    args: &Args,
    model: &str,
    tally: &mut Tally,
) -> Res<()> {
    let mut attempted = Vec::new();
    loop {
        let runner = format!("runner-{}", rng.below(16));
        let got = store.dequeue_many(64, Some(&runner)).await?;
        if got.is_empty() {
            break;
        }
        attempted.extend(got);
    }
    tally.attempts += attempted.len();
    let fates: Vec<Fate> = attempted.iter().map(|_| fate(rng)).collect();
    let started: Vec<(String, String, AttemptStatus)> = attempted
        .iter()
        .zip(&fates)
        .filter(|(_, f)| **f != Fate::Preparing)
        .map(|(a, _)| {
            (
                a.rollout.rollout_id.clone(),
                a.attempt.attempt_id.clone(),
                AttemptStatus::Running,
            )
        })
        .collect();
    update_all(store, started).await?;
    let mut batch = Vec::with_capacity(1_100);
    for (a, f) in attempted.iter().zip(&fates) {
        if *f == Fate::Preparing {
            continue;
        }
        let violation = rng.chance(0.08);
        let correct = *f == Fate::Succeeded && rng.chance(0.6);
        batch.extend(attempt_spans(
            rng,
            a,
            model,
            args.spans_per_rollout,
            *f != Fate::Running,
            violation,
            correct,
        ));
        if batch.len() >= 1_000 {
            tally.spans += batch.len();
            store.add_spans(std::mem::take(&mut batch)).await?;
        }
    }
    if !batch.is_empty() {
        tally.spans += batch.len();
        store.add_spans(batch).await?;
    }
    let finished: Vec<(String, String, AttemptStatus)> = attempted
        .iter()
        .zip(&fates)
        .filter_map(|(a, f)| {
            let st = match f {
                Fate::Succeeded => AttemptStatus::Succeeded,
                Fate::Failed => AttemptStatus::Failed,
                _ => return None,
            };
            Some((
                a.rollout.rollout_id.clone(),
                a.attempt.attempt_id.clone(),
                st,
            ))
        })
        .collect();
    update_all(store, finished).await?;
    for (a, f) in attempted.iter().zip(&fates) {
        if *f == Fate::Cancelled {
            store
                .update_rollout(
                    &a.rollout.rollout_id,
                    RolloutUpdate {
                        status: Some(RolloutStatus::Cancelled),
                        ..RolloutUpdate::default()
                    },
                )
                .await?;
        }
    }
    for r in 0..16 {
        store
            .update_worker(
                &format!("runner-{r}"),
                Some(json!({"gpu_util": rng.between(0.4, 0.99), "rss_mib": 900 + rng.below(400)})),
            )
            .await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let args = args()?;
    let began = Instant::now();
    let store = Arc::new(SqliteLightningStore::open(&args.path)?);
    let mut rng = Rng(args.seed);
    let mut tally = Tally::default();
    // The last 1 % stay in the queue, never dequeued.
    let tail = args.rollouts / 100;
    let body = args.rollouts - tail;
    let batches = body.div_ceil(args.batch).max(1);
    let mut version = 0;
    let mut enqueued = 0;
    for b in 0..batches {
        let wanted = 1 + b * 50 / batches;
        while version < wanted {
            version += 1;
            store
                .update_resources(&format!("policy-v{version}"), resources(version)?)
                .await?;
        }
        let n = args.batch.min(body - enqueued);
        let epoch = b * 3 / batches;
        let requests: Vec<_> = (0..n)
            .map(|i| request(&mut rng, enqueued + i, version, epoch))
            .collect();
        store.enqueue_many(requests).await?;
        enqueued += n;
        let model = format!("policy-v{version}");
        play_round(&store, &mut rng, &args, &model, &mut tally).await?;
        if (b + 1) % 10 == 0 || b + 1 == batches {
            eprintln!(
                "{enqueued} rollouts, {} attempts, {} spans, {:.1} s",
                tally.attempts,
                tally.spans,
                began.elapsed().as_secs_f64()
            );
        }
    }
    let requests: Vec<_> = (0..tail)
        .map(|i| request(&mut rng, enqueued + i, version, 3))
        .collect();
    if !requests.is_empty() {
        store.enqueue_many(requests).await?;
    }
    let stats = store.statistics().await?;
    store.close().await?;
    let seconds = began.elapsed().as_secs_f64();
    let size: u64 = ["", "-wal"]
        .iter()
        .filter_map(|suffix| {
            let mut p = args.path.clone().into_os_string();
            p.push(suffix);
            std::fs::metadata(p).ok().map(|m| m.len())
        })
        .sum();
    println!(
        "filled {} in {seconds:.1} s: {} rollouts, {} attempts, {} spans, {} workers, \
         {:.1} MiB",
        args.path.display(),
        stats.total_rollouts,
        stats.total_attempts,
        stats.total_spans,
        stats.total_workers,
        size as f64 / (1024.0 * 1024.0)
    );
    println!("rollouts by status: {:?}", stats.rollouts_by_status);
    Ok(())
}
