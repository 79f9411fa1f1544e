//! `agl audit verify | summary | export`: check, summarize and export a flight-recorder
//! database written by `agl train --audit-log`.
//!
//! Thin: verification, queries and the summary live in `agl-gov`; this module picks the key
//! and head, prints, and converts entries to the export formats (JSON Lines, OTLP/JSON). It
//! never writes to the database.
//!
//! Exit codes: `verify` 0 intact, 1 broken (the entry is named), 2 error (missing file, not a
//! recorder database, key problems, bad arguments). `summary` and `export`: 0, or 2 on error.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agl_core::semconv;
use agl_gov::{
    AUDIT_KEY_FILE_ENV, GENESIS_HASH, Head, HeadSource, Query, RecordEntry, RecorderReader,
    Summary, VerifyOptions, hmac_key_from_file,
};
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// `agl audit …` subcommands.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify a flight-recorder database: every hash, link, seq and the head anchor. Exit 0
    /// intact, 1 broken (naming the entry), 2 error.
    Verify {
        /// The SQLite database written by `agl train --audit-log`.
        db: PathBuf,
        /// HMAC key file of a keyed chain (default: the file named by $AGL_AUDIT_KEY_FILE).
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
        /// Head anchor kept elsewhere (JSON `{"seq","hash","count","mac"}`); default: the
        /// `DB.head` sidecar written by the recorder.
        #[arg(long, value_name = "FILE")]
        head: Option<PathBuf>,
        /// Skip the head anchor check (a truncated tail then goes undetected).
        #[arg(long, conflicts_with = "head")]
        no_head: bool,
    },
    /// Violation rate, violations per policy and per severity, and verdict counts.
    Summary {
        /// The SQLite database written by `agl train --audit-log`.
        db: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Export entries as JSON Lines or as one OTLP/JSON trace document.
    Export(Box<ExportArgs>),
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// One entry JSON per line (the hash input plus `hash`).
    Jsonl,
    /// One OTLP/JSON `ExportTraceServiceRequest`, one span per entry.
    OtlpJson,
}

/// Arguments of `agl audit export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The SQLite database written by `agl train --audit-log`.
    db: PathBuf,
    /// Output format.
    #[arg(long, value_enum)]
    format: ExportFormat,
    /// Write here instead of standard output. The file must not exist (never overwritten,
    /// symlinks never followed).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Only entries of this rollout id.
    #[arg(long, value_name = "ID")]
    rollout: Option<String>,
    /// Only entries after this seq (exclusive): the cursor of an incremental export.
    #[arg(long, value_name = "SEQ")]
    after: Option<u64>,
}

/// Runs an audit subcommand. `Err` means exit 2 (the caller prints it).
pub fn run(command: AuditCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify {
            db,
            key_file,
            head,
            no_head,
        } => verify(&db, key_file, head, no_head),
        AuditCommand::Summary { db, json } => summary(&db, json),
        AuditCommand::Export(args) => export(&args),
    }
}

/// The HMAC key from `--key-file`, else from `$AGL_AUDIT_KEY_FILE`, else none.
fn load_key(key_file: Option<PathBuf>) -> anyhow::Result<Option<Vec<u8>>> {
    let path = key_file.or_else(|| {
        std::env::var_os(AUDIT_KEY_FILE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    Ok(match path {
        Some(p) => Some(hmac_key_from_file(&p)?),
        None => None,
    })
}

fn verify(
    db: &Path,
    key_file: Option<PathBuf>,
    head: Option<PathBuf>,
    no_head: bool,
) -> anyhow::Result<ExitCode> {
    let hmac_key = load_key(key_file)?;
    let head = match (head, no_head) {
        (_, true) => HeadSource::None,
        (Some(h), false) => HeadSource::Explicit(Head::read(&h)?),
        (None, false) => HeadSource::Sidecar,
    };
    let reader = RecorderReader::open(db)?;
    let report = reader.verify(&VerifyOptions { hmac_key, head })?;
    if let Some(b) = &report.first_broken {
        println!("broken at entry {}: {}", b.seq, b.reason);
        return Ok(ExitCode::FAILURE);
    }
    let (seq, hash) = report
        .head
        .as_ref()
        .map_or((0, GENESIS_HASH), |h| (h.seq, h.hash.as_str()));
    println!("ok: {} entries, head seq {seq} hash {hash}", report.entries);
    if report.keyed {
        println!("chain: keyed (HMAC-SHA-256)");
    } else {
        println!("chain: unkeyed (SHA-256; anyone who can write the database can recompute it)");
    }
    if no_head {
        println!("note: head anchor not checked (--no-head): a truncated tail is not detected");
    }
    if report.beyond_head > 0 {
        println!(
            "note: {} entries after the head anchor (written after the head was last saved)",
            report.beyond_head
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(db: &Path, as_json: bool) -> anyhow::Result<ExitCode> {
    let s = RecorderReader::open(db)?.summary()?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", summary_table(&s));
    }
    Ok(ExitCode::SUCCESS)
}

fn summary_table(s: &Summary) -> String {
    let mut out = String::new();
    out.push_str(&format!("entries         {:>10}\n", s.entries));
    out.push_str(&format!(
        "with violations {:>10}   violation rate {:.4}\n",
        s.violations, s.violation_rate
    ));
    let section = |out: &mut String, title: &str, map: &std::collections::BTreeMap<String, u64>| {
        out.push_str(&format!("\n{title}\n"));
        if map.is_empty() {
            out.push_str("  (none)\n");
        }
        let mut rows: Vec<(&String, &u64)> = map.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (k, n) in rows {
            out.push_str(&format!("  {k:<24} {n:>10}\n"));
        }
    };
    section(&mut out, "entries per verdict", &s.by_verdict);
    section(&mut out, "violations per policy", &s.by_policy);
    section(&mut out, "violations per severity", &s.by_severity);
    out
}

/// Creates `path` for writing: refuses an existing file and never follows a symlink.
fn create_out(path: &Path) -> anyhow::Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    opts.open(path)
        .with_context(|| format!("cannot create `{}` (it must not exist yet)", path.display()))
}

fn export(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    let reader = RecorderReader::open(&args.db)?;
    let sink: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(create_out(p)?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut w = BufWriter::new(sink);
    let mut query = Query {
        rollout_id: args.rollout.clone(),
        after_seq: args.after,
        limit: 1000,
        ..Query::default()
    };
    let mut spans: Vec<Value> = Vec::new();
    let mut count = 0u64;
    loop {
        let page = reader.query(&query)?;
        for e in &page.entries {
            match args.format {
                ExportFormat::Jsonl => {
                    serde_json::to_writer(&mut w, e)?;
                    w.write_all(b"\n")?;
                }
                ExportFormat::OtlpJson => spans.push(otlp_span(e)),
            }
            count += 1;
        }
        if !page.more {
            break;
        }
        query.after_seq = page.next_cursor;
    }
    if args.format == ExportFormat::OtlpJson {
        serde_json::to_writer(&mut w, &otlp_document(spans))?;
        w.write_all(b"\n")?;
    }
    w.flush().context("writing the export")?;
    if let Some(p) = &args.out {
        eprintln!("exported {count} entries to {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Lowercase hex of the first `n` bytes of SHA-256(`text`).
fn hex_id(text: &str, n: usize) -> String {
    let digest = Sha256::digest(text.as_bytes());
    hex::encode(digest.get(..n).unwrap_or(&digest[..]))
}

fn kv_str(key: &str, v: &str) -> Value {
    json!({"key": key, "value": {"stringValue": v}})
}

fn kv_int(key: &str, v: u64) -> Value {
    // OTLP/JSON: 64-bit integers are strings.
    json!({"key": key, "value": {"intValue": v.to_string()}})
}

/// One OTLP/JSON span for one entry (lowerCamelCase fields, ids as hex, int64 as strings).
/// traceId: first 16 bytes of SHA-256(rollout_id), or of SHA-256(`"seq:<seq>"`) without a
/// rollout id; spanId: the seq as 16 hex digits.
pub fn otlp_span(e: &RecordEntry) -> Value {
    let trace_id = match &e.rollout_id {
        Some(r) => hex_id(r, 16),
        None => hex_id(&format!("seq:{}", e.seq), 16),
    };
    let nanos = ((e.time * 1e6).round().max(0.0) as u64).saturating_mul(1000);
    let mut attributes = vec![
        kv_int(semconv::agent_os::SEQ, e.seq),
        kv_str(semconv::agent_os::VERDICT, e.verdict.as_str()),
        kv_str(semconv::agent_os::MODE, e.mode.as_str()),
        kv_str(semconv::agent_os::ACTION_TYPE, &e.action_type),
        json!({"key": semconv::agent_os::POLICIES_VIOLATED, "value": {"arrayValue": {"values":
            e.policies.iter().map(|p| json!({"stringValue": p})).collect::<Vec<_>>()}}}),
        kv_int(semconv::agent_os::VIOLATIONS, e.violations.len() as u64),
        json!({"key": semconv::agent_os::BLOCKED, "value": {"boolValue": e.verdict == agl_gov::Verdict::Block}}),
        kv_str(semconv::agent_os::HASH, &e.hash),
        kv_str(semconv::agent_os::PREV_HASH, &e.prev_hash),
    ];
    if let Some(s) = e.severity {
        attributes.push(kv_str(semconv::agent_os::SEVERITY, s.as_str()));
    }
    if let Some(a) = &e.agent_id {
        attributes.push(kv_str(semconv::agent_os::AGENT_ID, a));
    }
    if let Some(r) = &e.rollout_id {
        attributes.push(kv_str(semconv::agl::ROLLOUT_ID, r));
    }
    if let Some(a) = &e.attempt_id {
        attributes.push(kv_str(semconv::agl::ATTEMPT_ID, a));
    }
    json!({
        "traceId": trace_id,
        "spanId": format!("{:016x}", e.seq),
        "name": "agentlightning.annotation",
        "kind": 1,
        "startTimeUnixNano": nanos.to_string(),
        "endTimeUnixNano": nanos.to_string(),
        "attributes": attributes,
    })
}

/// The `ExportTraceServiceRequest` wrapping `spans`.
fn otlp_document(spans: Vec<Value>) -> Value {
    json!({
        "resourceSpans": [{
            "resource": {"attributes": [kv_str("service.name", "agl-gov")]},
            "scopeSpans": [{
                "scope": {"name": semconv::agl::FLIGHT_RECORDER_SCOPE},
                "spans": spans,
            }],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_file_is_never_overwritten_nor_followed_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("existing.jsonl");
        std::fs::write(&existing, "keep").unwrap();
        assert!(create_out(&existing).is_err());
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep");
        let target = dir.path().join("target.txt");
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_out(&link).is_err());
        assert!(!target.exists(), "the symlink target must not be created");
        assert!(create_out(&dir.path().join("new.jsonl")).is_ok());
    }

    #[test]
    fn ids_are_hex_of_the_documented_length() {
        assert_eq!(hex_id("r-1", 16).len(), 32);
        assert_ne!(hex_id("r-1", 16), hex_id("r-2", 16));
        assert!(hex_id("x", 16).chars().all(|c| c.is_ascii_hexdigit()));
    }
}
