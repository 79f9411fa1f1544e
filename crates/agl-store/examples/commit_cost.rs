//! What one SQLite commit costs as a function of the pages it dirties, with the store's settings.
//!
//! ```text
//! cargo run --release -p agl-store --example commit_cost -- [--commits 20000] [--page-size 4096]
//! ```
//!
//! Opens a fresh database in a temporary directory with the store's connection settings
//! (`journal_mode=WAL`, `synchronous=NORMAL`) and 32 one-row tables, then times
//! `BEGIN IMMEDIATE` → one `UPDATE` in each of the first `n` tables → `COMMIT`, `--commits`
//! times for each `n` (0, 1, 2, 4, 8, 11, 13, 20, 32), with a passive checkpoint every 2,000
//! commits as the store's background checkpointer does. Each touched table is one dirty page,
//! so one WAL frame (a header and a page, two `pwrite`s) per table. Prints microseconds per
//! commit. This is the cost model behind the store's group commit: the runner's cycle dirties
//! about eleven pages per commit (see the `sqlite` module documentation of agl-store), so
//! fewer, larger commits and fewer pages per commit are what make the SQLite store faster.

use std::error::Error;
use std::time::Instant;

use rusqlite::Connection;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const TABLES: usize = 32;
const TOUCHED: [usize; 9] = [0, 1, 2, 4, 8, 11, 13, 20, 32];

fn flag(args: &[String], name: &str, default: u64) -> Res<u64> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            let value = args
                .get(i + 1)
                .ok_or_else(|| format!("{name} needs a value"))?;
            value
                .parse()
                .map_err(|e| format!("{name} {value}: {e}").into())
        }
    }
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(unknown) = args
        .iter()
        .step_by(2)
        .find(|a| *a != "--commits" && *a != "--page-size")
    {
        return Err(
            format!("unknown argument `{unknown}` (--commits N, --page-size BYTES)").into(),
        );
    }
    let commits = flag(&args, "--commits", 20_000)?.max(1);
    let page_size = flag(&args, "--page-size", 4096)?;
    let dir = tempfile::tempdir()?;
    let conn = Connection::open(dir.path().join("commit-cost.db"))?;
    // The page size takes effect only before the first write and before WAL mode.
    conn.execute_batch(&format!("PRAGMA page_size = {page_size}"))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("could not switch to WAL mode (journal_mode is `{mode}`)").into());
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL")?;
    for t in 0..TABLES {
        conn.execute_batch(&format!(
            "CREATE TABLE t{t} (id INTEGER PRIMARY KEY, v INTEGER); INSERT INTO t{t} VALUES (1, 0);"
        ))?;
    }
    let actual: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    println!("page size {actual} bytes, {commits} commits per row");
    println!("{:>13} {:>16}", "dirty pages", "µs per commit");
    for n in TOUCHED {
        let started = Instant::now();
        for k in 0..commits {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            for t in 0..n {
                conn.prepare_cached(&format!("UPDATE t{t} SET v = ?1 WHERE id = 1"))?
                    .execute([i64::try_from(k)?])?;
            }
            conn.execute_batch("COMMIT")?;
            if k % 2000 == 1999 {
                conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))?;
            }
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / commits as f64;
        println!("{n:>13} {us:>16.1}");
    }
    Ok(())
}
