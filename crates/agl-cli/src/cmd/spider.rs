//! `agl spider tasks` and `agl spider score`: the Spider task for agents agl did not write.
//!
//! - **`tasks`** writes one JSON task per line (JSON Lines, for `agl train --train-dataset` or
//!   any agent): `{"id", "db_id", "question", "schema", "gold", "db_path"}`. `id` is
//!   `<split>-<index>` (the question's 0-based position in its file); `schema` is the block the
//!   built-in `LlmSqlAgent` puts in its prompt ([`agl_spider::prompts::render_schema`] of
//!   [`agl_spider::db_info`]); `gold` the gold SQL; `db_path` the absolute path of the SQLite
//!   file; with `--messages`, also `messages`, the agent's write prompt for the task
//!   ([`agl_spider::prompts::write_messages`]). The questions are those agl's own commands select, with agl-spider's functions:
//!   train: [`agl_spider::train_questions`] (`--curriculum`, `--limit`, `--seed`, as
//!   `agl train --agent llm`); dev: [`agl_spider::dev_questions`] (`--limit N` spread evenly
//!   over the split, as `agl train --agent llm --eval-limit N`); either split with `--every K`:
//!   every K-th question in file order, then the first `--limit` (as `agl eval --every K`).
//!   With `--demonstrations`, each line is instead `{"messages": [system, user, assistant]}`:
//!   the write prompt and the gold SQL as the answer ([`agl_spider::prompts::write_answer`]),
//!   for `agl train --algorithm sft --demonstrations`.
//! - **`score`** reads lines `{"db_id", "gold", "predicted", …}` and prints each one back with
//!   `"match": true|false`, plus `"error"` when the predicted SQL failed (SQLite's message or
//!   the time-out) and `"gold_error"` when the gold SQL did. Both run in agl-spider's sandboxed
//!   [`Executor`] (in-memory copy, rolled back, `--sql-timeout`), and the results are compared
//!   with [`execution_match`], rows in order exactly when the gold SQL has a top-level
//!   `ORDER BY` ([`gold_is_ordered`]): the test `LlmSqlAgent`'s reward applies to the query it
//!   ran. Unlike the agent, `score` asks no governance kernel: a statement a policy would block
//!   runs in the sandbox (and is rolled back). `predicted` may be `null` (the agent wrote no
//!   SQL): no match, `"error": "no predicted SQL"`. Every input line is checked before any SQL
//!   runs, so a bad line (not JSON, a missing field, an unknown database) fails the command with
//!   one line naming the file and line number, and nothing is printed: the output is either
//!   every line scored or nothing.
//!
//! Not responsible for running an agent, the executor or the comparison (agl-spider).

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agl_spider::prompts::{PromptMessage, render_schema, write_answer, write_messages};
use agl_spider::{
    Curriculum, DATABASE_DIR, Executor, ExecutorConfig, Question, SpiderDataset, Split, db_info,
    dev_questions, execution_match, gold_is_ordered, train_questions,
};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::{Map, Value};

/// The subcommands of `agl spider`.
#[derive(Debug, Subcommand)]
pub enum SpiderCommand {
    /// Write Spider questions as JSON task lines (id, db_id, question, schema, gold, db_path)
    /// for agents agl did not write (`agl train --train-dataset`).
    Tasks(TasksArgs),
    /// Score predicted SQL against gold SQL by execution match, as the built-in SQL agent's
    /// reward does: each input line comes back with "match" (and "error").
    Score(ScoreArgs),
}

/// Arguments of `agl spider tasks`.
#[derive(Debug, Args)]
pub struct TasksArgs {
    /// The split: train or dev.
    #[arg(long, value_parser = crate::args::data::parse_split, value_name = "train|dev")]
    split: Split,
    /// Train questions (--split train): easy (single-table SELECT gold queries, the default, as
    /// `agl train --agent llm`) or all.
    #[arg(long, value_name = "easy|all", value_parser = parse_curriculum, conflicts_with = "every")]
    curriculum: Option<Curriculum>,
    /// At most N questions: train, the first N of the curriculum (then shuffled with --seed);
    /// dev, N spread evenly over the split (`agl train --eval-limit N`); with --every, the
    /// first N selected.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Every K-th question of the split in file order (0, K, 2K, …), as `agl eval --every K`
    /// (no curriculum, no shuffle).
    #[arg(long, value_name = "K")]
    every: Option<usize>,
    /// Seed of the train order (--split train), as `agl train --seed` [default: 0].
    #[arg(long, value_name = "S", conflicts_with = "every")]
    seed: Option<u64>,
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Also write each task's `messages`: the built-in SQL agent's write prompt for it (system
    /// and user message, as it sends them to the model).
    #[arg(long)]
    messages: bool,
    /// Write demonstrations for `agl train --algorithm sft --demonstrations` instead of tasks:
    /// one `{"messages": [...]}` per question, the agent's write prompt followed by the gold SQL
    /// as the assistant's answer (in the ```sql block the prompt asks for).
    #[arg(long, conflicts_with = "messages")]
    demonstrations: bool,
    /// Write the tasks to FILE instead of stdout.
    #[arg(long, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
}

/// Arguments of `agl spider score`.
#[derive(Debug, Args)]
pub struct ScoreArgs {
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// JSON Lines input, one {"db_id", "gold", "predicted"} object per line [default: stdin].
    #[arg(long = "in", value_name = "FILE.jsonl")]
    input: Option<PathBuf>,
    /// Time limit of each statement, seconds (as `agl train --sql-timeout`).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    sql_timeout: f64,
}

/// Runs `agl spider …`.
pub fn run(command: SpiderCommand) -> anyhow::Result<ExitCode> {
    match command {
        SpiderCommand::Tasks(args) => tasks(args),
        SpiderCommand::Score(args) => score(args),
    }
}

fn parse_curriculum(s: &str) -> Result<Curriculum, String> {
    match s {
        "easy" => Ok(Curriculum::Easy),
        "all" => Ok(Curriculum::All),
        other => Err(format!(
            "unknown curriculum `{other}` (expected easy or all)"
        )),
    }
}

/// One line of `agl spider tasks`.
#[derive(Debug, Serialize)]
struct Task<'a> {
    id: String,
    db_id: &'a str,
    question: &'a str,
    schema: &'a str,
    gold: &'a str,
    db_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<Vec<PromptMessage>>,
}

/// The questions `args` select (see the module docs).
fn select<'d>(dataset: &'d SpiderDataset, args: &TasksArgs) -> anyhow::Result<Vec<Question>> {
    if args.split == Split::Dev && (args.curriculum.is_some() || args.seed.is_some()) {
        bail!("--curriculum and --seed apply to --split train only");
    }
    let all: &'d [Question] = dataset.questions(args.split);
    let picked: Vec<Question> = match (args.every, args.split) {
        (Some(0), _) => bail!("--every must be at least 1"),
        (Some(k), _) => all
            .iter()
            .step_by(k)
            .take(args.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect(),
        (None, Split::Train) => train_questions(
            dataset,
            args.curriculum.unwrap_or(Curriculum::Easy),
            args.limit,
            args.seed.unwrap_or(0),
        )
        .into_iter()
        .cloned()
        .collect(),
        (None, Split::Dev) => dev_questions(dataset, args.limit.unwrap_or(all.len())).0,
    };
    if picked.is_empty() {
        bail!(
            "no questions selected: the {} split has {} (--limit {}, --every {})",
            args.split,
            all.len(),
            args.limit.map_or("none".into(), |n| n.to_string()),
            args.every.map_or("none".into(), |k| k.to_string()),
        );
    }
    Ok(picked)
}

fn tasks(args: TasksArgs) -> anyhow::Result<ExitCode> {
    let data = crate::args::data::data_dir(args.data.clone());
    if !data.is_dir() {
        bail!(
            "data directory {} does not exist (pass --data DIR)",
            data.display()
        );
    }
    let dataset = SpiderDataset::load(&data)
        .with_context(|| format!("loading Spider data from {}", data.display()))?;
    let questions = select(&dataset, &args)?;
    let mut schemas: std::collections::HashMap<String, (String, String)> = Default::default();
    let mut text = String::new();
    for q in &questions {
        if !schemas.contains_key(&q.db_id) {
            let path = dataset.db_path(&q.db_id);
            let info = db_info(&q.db_id, &path)?;
            let abs = std::fs::canonicalize(&path)
                .with_context(|| format!("resolving {}", path.display()))?;
            schemas.insert(
                q.db_id.clone(),
                (render_schema(&info), abs.display().to_string()),
            );
        }
        let (schema, db_path) = &schemas[&q.db_id];
        if args.demonstrations {
            let mut messages = write_messages(schema, &q.question);
            messages.push(PromptMessage::assistant(write_answer(&q.gold_sql)));
            text.push_str(&serde_json::to_string(
                &serde_json::json!({ "messages": messages }),
            )?);
            text.push('\n');
            continue;
        }
        let task = Task {
            id: format!("{}-{}", q.split, q.index),
            db_id: &q.db_id,
            question: &q.question,
            schema,
            gold: &q.gold_sql,
            db_path: db_path.clone(),
            messages: args.messages.then(|| write_messages(schema, &q.question)),
        };
        text.push_str(&serde_json::to_string(&task)?);
        text.push('\n');
    }
    match &args.out {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!(
                "wrote {} {} tasks to {}",
                questions.len(),
                args.split,
                path.display()
            );
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One checked input line of `agl spider score`.
struct Pair {
    fields: Map<String, Value>,
    db_id: String,
    gold: String,
    predicted: Option<String>,
}

/// Checks one input line: a JSON object with string `db_id` and `gold`, `predicted` a string
/// or null, and a database of that id under `db_root`. The error says what is wrong.
fn parse_pair(line: &str, db_root: &Path) -> Result<Pair, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON ({e})"))?;
    let Value::Object(fields) = value else {
        return Err("not a JSON object".into());
    };
    let text = |name: &str| -> Result<String, String> {
        match fields.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("`{name}` is not a string")),
            None => Err(format!(
                "missing field `{name}` (each line needs db_id, gold and predicted)"
            )),
        }
    };
    let db_id = text("db_id")?;
    let gold = text("gold")?;
    let predicted = match fields.get("predicted") {
        Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`predicted` is not a string or null".into()),
        None => {
            return Err(
                "missing field `predicted` (each line needs db_id, gold and predicted)".into(),
            );
        }
    };
    let plain = !db_id.is_empty() && db_id.chars().all(|c| c.is_alphanumeric() || c == '_');
    if !plain
        || !db_root
            .join(&db_id)
            .join(format!("{db_id}.sqlite"))
            .is_file()
    {
        return Err(format!(
            "unknown database `{db_id}` (no {}/{db_id}/{db_id}.sqlite)",
            db_root.display()
        ));
    }
    Ok(Pair {
        fields,
        db_id,
        gold,
        predicted,
    })
}

fn score(args: ScoreArgs) -> anyhow::Result<ExitCode> {
    if !(args.sql_timeout > 0.0 && args.sql_timeout.is_finite()) {
        bail!(
            "--sql-timeout must be a positive number of seconds, not {}",
            args.sql_timeout
        );
    }
    let data = crate::args::data::data_dir(args.data);
    let db_root = data.join(DATABASE_DIR);
    if !db_root.is_dir() {
        bail!(
            "no Spider databases at {} (pass --data DIR)",
            db_root.display()
        );
    }
    let (name, reader): (String, Box<dyn BufRead>) = match &args.input {
        Some(path) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            (
                path.display().to_string(),
                Box::new(std::io::BufReader::new(file)),
            )
        }
        None => ("<stdin>".into(), Box::new(std::io::stdin().lock())),
    };
    let mut pairs = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{name}:{}: reading", i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let pair = parse_pair(&line, &db_root)
            .map_err(|e| anyhow::anyhow!("{name}:{}: {e}; nothing was scored", i + 1))?;
        pairs.push(pair);
    }
    let mut executor = Executor::new(
        db_root,
        ExecutorConfig {
            timeout: Duration::from_secs_f64(args.sql_timeout),
        },
    );
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut matched = 0usize;
    let total = pairs.len();
    for mut pair in pairs.drain(..) {
        let predicted = pair.predicted.as_deref().map(|sql| {
            executor
                .execute(&pair.db_id, sql)
                .map_err(|e| e.to_string())
        });
        let gold = executor
            .execute(&pair.db_id, &pair.gold)
            .map_err(|e| e.to_string());
        let is_match = match (&gold, &predicted) {
            (Ok(g), Some(Ok(p))) => {
                execution_match(&g.result, &p.result, gold_is_ordered(&pair.gold))
            }
            _ => false,
        };
        matched += usize::from(is_match);
        pair.fields.insert("match".into(), Value::Bool(is_match));
        match predicted {
            None => {
                pair.fields
                    .insert("error".into(), Value::String("no predicted SQL".into()));
            }
            Some(Err(e)) => {
                pair.fields.insert("error".into(), Value::String(e));
            }
            Some(Ok(_)) => {}
        }
        if let Err(e) = gold {
            pair.fields.insert("gold_error".into(), Value::String(e));
        }
        serde_json::to_writer(&mut out, &pair.fields)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    eprintln!("scored {total} lines of {name}: {matched} match");
    Ok(ExitCode::SUCCESS)
}
