//! `agl triplets --store-url URL --rollout-id RID`: reads one attempt's spans from a store
//! server and prints the triplets Agent Lightning's `TracerTraceToTriplet` makes of them.
//!
//! Output (stdout, one JSON object): `{"rollout_id", "attempt_id", "for_training", "triplets":
//! [...], "llm_calls", "refused_missing_token_ids", "refused_empty_token_ids",
//! "refused_invalid_logprobs", "refused_invalid_forced_positions", "blocked", "refused":
//! [...]}` (see [`agl_train::TripletReport`]). Without `--for-training` every call becomes a
//! triplet (empty `token_ids` where a call has none) and the refusal counts are 0. With
//! `--messages`, the calls as OpenAI chat conversations instead (Agent Lightning's
//! `TraceToMessages`, [`agl_train::TraceToMessages`]): `{"rollout_id", "attempt_id",
//! "conversations": [{"messages": [...], "tools": [...]|null}], "dropped_messages"}`, one per
//! selected call, the answer last (`role` `assistant`, with its `tool_calls`). Failures
//! (unknown rollout or attempt, no spans, unreachable store, bad regex) exit 1 with one line on
//! stderr. Not responsible for the conversion itself (`agl_train::tracer_adapter`).

use std::process::ExitCode;

use agl_store::{LightningStore, SpanQuery};
use agl_train::tracer_adapter::compile_pattern;
use agl_train::{DEFAULT_LLM_CALL_MATCH, RewardMatchPolicy, TracerTraceToTriplet, TripletReport};
use anyhow::Context;
use clap::Args;
use serde::Serialize;

/// Arguments of `agl triplets`.
#[derive(Debug, Args)]
pub struct TripletsArgs {
    /// The store server, e.g. http://127.0.0.1:4747 (`agl store`).
    #[arg(long, value_name = "URL")]
    store_url: String,
    #[command(flatten)]
    token: crate::args::store::TokenArg,
    /// The rollout whose spans to read.
    #[arg(long, value_name = "RID")]
    rollout_id: String,
    /// The attempt, or `latest` (the rollout's attempt with the highest sequence id).
    #[arg(long, value_name = "AID", default_value = agl_core::LATEST)]
    attempt_id: String,
    /// Refuse LLM calls without usable token ids (counted and listed, never re-tokenized).
    #[arg(long, conflicts_with = "messages")]
    for_training: bool,
    /// Print the selected calls as OpenAI chat conversations (`messages`, `tools`) instead of
    /// triplets, e.g. as fine-tuning data or for a prompt critic.
    #[arg(long)]
    messages: bool,
    /// Span names that are LLM calls (regex search).
    #[arg(long, value_name = "REGEX", default_value = DEFAULT_LLM_CALL_MATCH)]
    llm_call_match: String,
    /// Only LLM calls inside an agent span whose agent name matches (regex search).
    #[arg(long, value_name = "REGEX")]
    agent_match: Option<String>,
    /// How rewards are given to LLM calls: first_occurrence or first_sibling.
    #[arg(long, value_name = "POLICY", default_value = "first_occurrence",
          value_parser = crate::args::parse_name::<RewardMatchPolicy>)]
    reward_match: RewardMatchPolicy,
    /// Keep the span tree as recorded (no re-nesting of root-level spans by time).
    #[arg(long)]
    no_repair_hierarchy: bool,
    /// Keep LLM calls made inside reward spans (e.g. an LLM judge).
    #[arg(long)]
    include_llm_calls_in_reward: bool,
}

/// What `agl triplets` prints.
#[derive(Debug, Serialize)]
struct Output {
    rollout_id: String,
    attempt_id: String,
    for_training: bool,
    #[serde(flatten)]
    report: TripletReport,
}

/// What `agl triplets --messages` prints.
#[derive(Debug, Serialize)]
struct MessagesOutput {
    rollout_id: String,
    attempt_id: String,
    #[serde(flatten)]
    report: agl_train::MessagesReport,
}

/// Runs `agl triplets`.
pub fn run(args: TripletsArgs) -> anyhow::Result<ExitCode> {
    let adapter = TracerTraceToTriplet {
        repair_hierarchy: !args.no_repair_hierarchy,
        llm_call_match: compile_pattern("--llm-call-match", &args.llm_call_match)?,
        agent_match: args
            .agent_match
            .as_deref()
            .map(|p| compile_pattern("--agent-match", p))
            .transpose()?,
        exclude_llm_call_in_reward: !args.include_llm_calls_in_reward,
        reward_match: args.reward_match,
    };
    let client = crate::remote::client(&args.store_url, args.token.auth_token.clone())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let (attempt_id, spans) = rt.block_on(read_spans(&client, &args))?;
    if args.messages {
        let report = agl_train::TraceToMessages::new(adapter)
            .adapt(&spans)
            .with_context(|| format!("rollout {} attempt {attempt_id}", args.rollout_id))?;
        let out = MessagesOutput {
            rollout_id: args.rollout_id,
            attempt_id,
            report,
        };
        println!("{}", serde_json::to_string(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let report = adapter
        .adapt_with_report(&spans, args.for_training)
        .with_context(|| format!("rollout {} attempt {attempt_id}", args.rollout_id))?;
    let out = Output {
        rollout_id: args.rollout_id,
        attempt_id,
        for_training: args.for_training,
        report,
    };
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// The attempt id (resolved from `latest`) and its spans in `sequence_id` order.
async fn read_spans(
    store: &dyn LightningStore,
    args: &TripletsArgs,
) -> anyhow::Result<(String, Vec<agl_core::Span>)> {
    let (url, rid) = (&args.store_url, &args.rollout_id);
    let rollout = store
        .get_rollout_by_id(rid)
        .await
        .with_context(|| format!("reading rollout {rid} from {url}"))?;
    anyhow::ensure!(
        rollout.is_some(),
        "rollout {rid} not found in the store at {url} (check --rollout-id)"
    );
    let attempt_id = if args.attempt_id == agl_core::LATEST {
        store
            .get_latest_attempt(rid)
            .await
            .with_context(|| format!("reading the attempts of rollout {rid}"))?
            .with_context(|| format!("rollout {rid} has no attempt yet"))?
            .attempt_id
    } else {
        let attempts = store
            .list_attempts(rid)
            .await
            .with_context(|| format!("reading the attempts of rollout {rid}"))?;
        anyhow::ensure!(
            attempts.iter().any(|a| a.attempt_id == args.attempt_id),
            "attempt {} of rollout {rid} not found (check --attempt-id, or pass latest)",
            args.attempt_id
        );
        args.attempt_id.clone()
    };
    let spans = store
        .query_spans(SpanQuery::of(rid, Some(&attempt_id)))
        .await
        .with_context(|| format!("reading the spans of rollout {rid} attempt {attempt_id}"))?
        .items;
    anyhow::ensure!(
        !spans.is_empty(),
        "rollout {rid} attempt {attempt_id} has no spans"
    );
    Ok((attempt_id, spans))
}
