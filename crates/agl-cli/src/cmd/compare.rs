//! `agl compare BEFORE.json AFTER.json`: two `agl eval --rows` reports on the same questions,
//! compared question by question: accuracy and violation rate before and after, their paired
//! difference with a 95% bootstrap interval, and McNemar's exact test ([`mod@agl_train::paired`]).
//!
//! The reports must be of the same agent, split and questions (the rows' `index`, the
//! question's position in its split file): a paired comparison of different questions means
//! nothing, so it is refused, naming the questions only one report has.
//!
//! Responsible for reading and checking the reports and printing; not for pairing the
//! outcomes or the statistics ([`DevPaired::of_outcomes`], shared with `agl train --agent llm`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::out::table::Columns;
use agl_spider::DevPaired;
use agl_train::Paired;

/// Arguments of `agl compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The first report (`agl eval --rows --report FILE`), e.g. the untrained agent.
    #[arg(value_name = "BEFORE.json")]
    before: PathBuf,
    /// The second report, on the same questions, e.g. the trained adapter.
    #[arg(value_name = "AFTER.json")]
    after: PathBuf,
    /// Seed of the bootstrap resampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the comparison as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// What `agl compare` reads of a report (other fields are ignored).
#[derive(Debug, Deserialize)]
struct ReportIn {
    agent: String,
    #[serde(default)]
    seed: Option<u64>,
    data: DataIn,
    #[serde(default)]
    config: serde_json::Value,
    questions: Option<Vec<RowIn>>,
}

#[derive(Debug, Deserialize)]
struct DataIn {
    split: String,
    selection: String,
}

/// One question's row: an LLM row (`sql_violations`, `llm_violations`) or a scorer row
/// (`policies`).
#[derive(Debug, Deserialize)]
struct RowIn {
    index: usize,
    correct: bool,
    #[serde(default)]
    sql_violations: Vec<String>,
    #[serde(default)]
    llm_violations: Vec<String>,
    #[serde(default)]
    policies: Vec<String>,
}

impl RowIn {
    fn violated(&self) -> bool {
        !(self.sql_violations.is_empty()
            && self.llm_violations.is_empty()
            && self.policies.is_empty())
    }
}

/// The comparison, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Comparison {
    agent: String,
    split: String,
    before: Side,
    after: Side,
    questions: usize,
    /// Bootstrap resamples and seed behind the intervals.
    resamples: usize,
    seed: u64,
    accuracy: Paired,
    violation_rate: Paired,
}

/// Which run a report is.
#[derive(Debug, Serialize)]
struct Side {
    report: String,
    /// The model, adapter or checkpoint the report names.
    evaluated: String,
    selection: String,
}

fn read(path: &Path) -> anyhow::Result<(ReportIn, BTreeMap<usize, RowIn>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut report: ReportIn = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not an `agl eval` report (agent, data.split, data.selection and questions expected)",
            path.display()
        )
    })?;
    let Some(rows) = report.questions.take() else {
        bail!(
            "{}: the report has no per-question rows (run `agl eval` with --rows)",
            path.display()
        );
    };
    let mut by_index = BTreeMap::new();
    for row in rows {
        let index = row.index;
        if by_index.insert(index, row).is_some() {
            bail!(
                "{}: question {index} has two rows; a report has one row per question",
                path.display()
            );
        }
    }
    Ok((report, by_index))
}

/// What a report evaluated: its model and adapter, or the scorer's checkpoint.
fn evaluated(report: &ReportIn) -> String {
    let s = |k: &str| report.config.get(k).and_then(|v| v.as_str());
    match (s("model"), s("adapter"), s("checkpoint")) {
        (Some(m), Some(a), _) => format!("{m} + adapter {a}"),
        (Some(m), None, _) => m.to_string(),
        (None, _, Some(c)) => format!("checkpoint {c}"),
        (None, _, None) => match report.seed {
            Some(seed) => format!("untrained {}, seed {seed}", report.agent),
            None => format!("untrained {}", report.agent),
        },
    }
}

/// The first few indices of `xs`, for an error message.
fn some(xs: &[usize]) -> String {
    let shown: Vec<String> = xs.iter().take(5).map(usize::to_string).collect();
    let more = if xs.len() > 5 { ", …" } else { "" };
    format!("{}{more}", shown.join(", "))
}

fn compare(args: &CompareArgs) -> anyhow::Result<Comparison> {
    let (before, b_rows) = read(&args.before)?;
    let (after, a_rows) = read(&args.after)?;
    if before.agent != after.agent {
        bail!(
            "the reports are of different agents ({} in {}, {} in {})",
            before.agent,
            args.before.display(),
            after.agent,
            args.after.display()
        );
    }
    if before.data.split != after.data.split {
        bail!(
            "the reports are of different splits ({} in {}, {} in {})",
            before.data.split,
            args.before.display(),
            after.data.split,
            args.after.display()
        );
    }
    let only = |x: &BTreeMap<usize, RowIn>, y: &BTreeMap<usize, RowIn>| -> Vec<usize> {
        x.keys().filter(|k| !y.contains_key(k)).copied().collect()
    };
    let (only_b, only_a) = (only(&b_rows, &a_rows), only(&a_rows, &b_rows));
    if !only_b.is_empty() || !only_a.is_empty() {
        bail!(
            "the reports are not of the same questions: {} only in {} ({}), {} only in {} ({}); evaluate both with the same --every/--offset/--limit",
            only_b.len(),
            args.before.display(),
            some(&only_b),
            only_a.len(),
            args.after.display(),
            some(&only_a)
        );
    }
    let outcomes = |rows: &BTreeMap<usize, RowIn>| -> BTreeMap<usize, (bool, bool)> {
        rows.iter()
            .map(|(&i, r)| (i, (r.correct, r.violated())))
            .collect()
    };
    let Some(DevPaired {
        accuracy,
        violation_rate,
    }) = DevPaired::of_outcomes(&outcomes(&b_rows), &outcomes(&a_rows), args.seed)
    else {
        bail!("the reports have no questions");
    };
    let side = |path: &Path, r: &ReportIn| Side {
        report: path.display().to_string(),
        evaluated: evaluated(r),
        selection: r.data.selection.clone(),
    };
    Ok(Comparison {
        agent: before.agent.clone(),
        split: before.data.split.clone(),
        before: side(&args.before, &before),
        after: side(&args.after, &after),
        questions: b_rows.len(),
        resamples: agl_train::paired::RESAMPLES,
        seed: args.seed,
        accuracy,
        violation_rate,
    })
}

/// A p-value in four decimals, or in scientific notation below 0.001.
fn p_value(p: f64) -> String {
    if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.4}")
    }
}

fn table(c: &Comparison) -> String {
    let cols = Columns {
        label: 16,
        first: 8,
        cell: 10,
        sep: "  ",
    };
    let mut out = vec![
        format!(
            "{} questions of the {} split, paired (the same questions in both reports)",
            c.questions, c.split
        ),
        format!("  before: {} ({})", c.before.evaluated, c.before.report),
        format!("  after:  {} ({})", c.after.evaluated, c.after.report),
        String::new(),
        format!(
            "{}  {:>18}  {:>20}  {:>9}",
            cols.line(
                "",
                "before",
                ["after".to_string(), "difference".to_string()]
            ),
            "95% interval",
            "only before / after",
            "McNemar p"
        ),
    ];
    for (label, p) in [
        ("accuracy", &c.accuracy),
        ("violation rate", &c.violation_rate),
    ] {
        out.push(format!(
            "{}  {:>18}  {:>20}  {:>9}",
            cols.line(
                label,
                &format!("{:.3}", p.before),
                [format!("{:.3}", p.after), format!("{:+.3}", p.difference)]
            ),
            format!("[{:+.3}, {:+.3}]", p.low, p.high),
            format!("{} / {}", p.only_before, p.only_after),
            p_value(p.mcnemar_p)
        ));
    }
    out.push(String::new());
    out.push(format!(
        "interval: percentile bootstrap over questions ({} resamples, --seed {}); McNemar: two-sided exact binomial test of the questions that changed",
        c.resamples, c.seed
    ));
    out.join("\n")
}

/// Runs `agl compare`.
pub fn run(args: CompareArgs) -> anyhow::Result<ExitCode> {
    let c = compare(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        println!("{}", table(&c));
    }
    Ok(ExitCode::SUCCESS)
}
