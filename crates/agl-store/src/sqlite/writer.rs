//! The writer thread: the one connection of a store instance and its group commit.
//!
//! Responsible for running every operation of one [`super::SqliteLightningStore`] on a
//! dedicated OS thread that owns the `rusqlite::Connection`. Operations arrive on a channel;
//! the thread takes every operation waiting, opens one `BEGIN IMMEDIATE` transaction, runs
//! the operations and those that arrived while they ran (up to [`MAX_BATCH`] in all), commits
//! once, and only then answers the callers. So every operation is acknowledged only once durable, while concurrent callers
//! share one commit (group commit); atomicity per operation is explained at `run_op`. Also
//! responsible for waking `wait_for_rollouts` after a commit that finished a rollout, for the
//! background checkpointer thread, and for the `TRUNCATE` checkpoint on close. Not responsible
//! for any store rule (see the sibling `db` module).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use agl_core::now_seconds;
use tokio::sync::{oneshot, watch};

use super::db::Ctx;
use crate::error::StoreError;

/// Most operations committed together in one transaction.
pub(crate) const MAX_BATCH: usize = 256;

/// Time between two background checkpoints.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// The background checkpointer: a thread with its own connection that copies the WAL into the
/// database file (`wal_checkpoint(PASSIVE)`) every [`CHECKPOINT_INTERVAL`], so the writer
/// thread rarely pays for checkpoints (their copies and `fsync`s). It stops when this handle
/// is stopped or dropped (the writer thread owns it).
pub(crate) struct Checkpointer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens the checkpointer's connection and starts its thread.
    pub(crate) fn spawn(path: &Path) -> Result<Self, StoreError> {
        let conn = super::schema::open_checkpointer(path)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let shown: PathBuf = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("agl-sqlite-checkpoint".to_string())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_INTERVAL)
                {
                    // A failed passive checkpoint is retried at the next tick; the writer's
                    // own auto-checkpoint bounds the WAL meanwhile.
                    let _ = super::schema::checkpoint_passive(&conn, &shown);
                }
            })
            .map_err(|e| {
                StoreError::Backend(format!(
                    "sqlite store `{}`: cannot start the checkpointer thread: {e}",
                    path.display()
                ))
            })?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (its connection is closed on return).
    pub(crate) fn stop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One operation queued for the writer thread.
pub(crate) trait Job: Send {
    /// Runs the operation inside the open transaction; the answer is held until the commit.
    fn run(self: Box<Self>, ctx: &mut Ctx) -> Box<dyn Answer>;
    /// Answers without running (the transaction could not be opened).
    fn fail(self: Box<Self>, error: StoreError);
}

/// The held answer of a job that ran.
pub(crate) trait Answer: Send {
    /// Sends the result, or the commit error when the transaction failed.
    fn send(self: Box<Self>, commit: Result<(), &StoreError>);
}

/// A message to the writer thread.
pub(crate) enum Msg {
    /// Run an operation.
    Job(Box<dyn Job>),
    /// Commit what is pending, checkpoint the WAL, answer and stop.
    Close(oneshot::Sender<Result<(), StoreError>>),
}

/// A typed operation: `f(ctx, now)`, run after the lazy watchdog scan when `scan` is set.
pub(crate) struct Call<T, F> {
    pub(crate) scan: bool,
    pub(crate) f: F,
    pub(crate) reply: oneshot::Sender<Result<T, StoreError>>,
}

struct Held<T> {
    result: Result<T, StoreError>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send + 'static> Answer for Held<T> {
    fn send(self: Box<Self>, commit: Result<(), &StoreError>) {
        let Held { result, reply } = *self;
        let out = match (commit, result) {
            (Ok(()), result) => result,
            // An operation that failed keeps its own error.
            (Err(_), Err(own)) => Err(own),
            (Err(e), Ok(_)) => Err(e.clone()),
        };
        // The caller may have stopped waiting (dropped future); nothing to do then.
        let _ = reply.send(out);
    }
}

impl<T, F> Job for Call<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut Ctx, f64) -> Result<T, StoreError> + Send + 'static,
{
    fn run(self: Box<Self>, ctx: &mut Ctx) -> Box<dyn Answer> {
        let Call { scan, f, reply } = *self;
        let result = run_op(ctx, scan, f);
        Box::new(Held { result, reply })
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

/// Runs one operation: the debounced lazy scan (kept even when the operation fails; it
/// protects itself with a savepoint), then the operation.
///
/// Operations check their input before they write, so a refused request (not found, invalid,
/// illegal transition) has written nothing. An operation that fails **after** writing (a
/// database failure) poisons the transaction: `ctx.poisoned` is set and the writer rolls the
/// whole transaction back. This keeps every operation atomic without a savepoint per
/// operation (a savepoint copies every page it touches into a statement journal).
fn run_op<T>(
    ctx: &mut Ctx,
    scan: bool,
    f: impl FnOnce(&mut Ctx, f64) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let now = now_seconds();
    if scan && ctx.scan_due(now) {
        ctx.scan_now(now)?;
    }
    ctx.keep_on_error = false;
    let changes = ctx.total_changes();
    let result = f(ctx, now);
    if let Err(e) = &result
        && !ctx.keep_on_error
        && ctx.total_changes() != changes
    {
        ctx.poisoned = Some(e.clone());
    }
    ctx.keep_on_error = false;
    result
}

/// Runs jobs in transactions (normally one) and answers each job after its commit.
///
/// Before committing, the transaction also runs the jobs that arrived while it ran (`more`
/// gives them, until it returns `None`): they would otherwise wait for this commit and then
/// pay for one of their own, so a busy store commits less often for the same work.
fn run_batch(
    ctx: &mut Ctx,
    jobs: &mut Vec<Box<dyn Job>>,
    finished: &watch::Sender<u64>,
    more: &mut dyn FnMut() -> Option<Box<dyn Job>>,
) {
    let mut pending = VecDeque::from(std::mem::take(jobs));
    loop {
        if pending.is_empty() {
            match more() {
                Some(job) => pending.push_back(job),
                None => return,
            }
        }
        if !ctx.is_autocommit() {
            // A previous failure left a transaction open; start clean.
            let _ = ctx.exec("ROLLBACK");
        }
        if let Err(e) = ctx.exec("BEGIN IMMEDIATE") {
            for job in pending {
                job.fail(e.clone());
            }
            return;
        }
        ctx.finished = false;
        ctx.poisoned = None;
        let mut answers: Vec<Box<dyn Answer>> = Vec::new();
        while let Some(job) = pending.pop_front().or_else(&mut *more) {
            answers.push(job.run(ctx));
            if ctx.poisoned.is_some() {
                // The rest of the batch goes into a fresh transaction.
                break;
            }
        }
        let commit = match ctx.poisoned.take() {
            Some(e) => {
                let _ = ctx.exec("ROLLBACK");
                Err(StoreError::Backend(format!(
                    "sqlite: the transaction was rolled back because an operation committed \
                     with this one failed: {e}"
                )))
            }
            None => ctx.exec("COMMIT").inspect_err(|_| {
                let _ = ctx.exec("ROLLBACK");
            }),
        };
        if commit.is_ok() && ctx.finished {
            finished.send_modify(|n| *n = n.wrapping_add(1));
        }
        for answer in answers {
            answer.send(commit.as_ref().map(|_| ()));
        }
        if pending.is_empty() {
            return;
        }
    }
}

/// The body of the writer thread; returns when every sender is gone or on `Close`.
pub(crate) fn run(
    mut ctx: Ctx,
    rx: mpsc::Receiver<Msg>,
    finished: watch::Sender<u64>,
    mut checkpointer: Checkpointer,
) {
    let mut jobs: Vec<Box<dyn Job>> = Vec::new();
    loop {
        let mut close = None;
        match rx.recv() {
            Ok(Msg::Job(job)) => jobs.push(job),
            Ok(Msg::Close(reply)) => close = Some(reply),
            Err(_) => return,
        }
        while close.is_none() && jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(Msg::Job(job)) => jobs.push(job),
                Ok(Msg::Close(reply)) => close = Some(reply),
                Err(_) => break,
            }
        }
        if !jobs.is_empty() {
            let mut taken = jobs.len();
            let mut more = || {
                if close.is_some() || taken >= MAX_BATCH {
                    return None;
                }
                match rx.try_recv() {
                    Ok(Msg::Job(job)) => {
                        taken += 1;
                        Some(job)
                    }
                    Ok(Msg::Close(reply)) => {
                        close = Some(reply);
                        None
                    }
                    Err(_) => None,
                }
            };
            run_batch(&mut ctx, &mut jobs, &finished, &mut more);
        }
        if let Some(reply) = close {
            checkpointer.stop();
            let _ = reply.send(ctx.checkpoint());
            // Anything queued after the close is refused; the connection closes on return.
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    Msg::Job(job) => job.fail(StoreError::Closed),
                    Msg::Close(reply) => {
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_core::EnqueueRolloutRequest;
    use serde_json::json;

    fn ctx(dir: &tempfile::TempDir) -> Ctx {
        let path = dir.path().join("w.db");
        let (conn, _) = super::super::schema::open(&path, false, true).unwrap();
        Ctx::new(conn, path, 0.0)
    }

    type Reply<T> = oneshot::Receiver<Result<T, StoreError>>;

    fn job<T, F>(f: F) -> (Box<dyn Job>, Reply<T>)
    where
        T: Send + 'static,
        F: FnOnce(&mut Ctx, f64) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        (
            Box::new(Call {
                scan: false,
                f,
                reply,
            }),
            rx,
        )
    }

    fn enqueue(ctx: &mut Ctx, now: f64) -> Result<String, StoreError> {
        Ok(ctx
            .enqueue(EnqueueRolloutRequest::new(json!(1)), now)?
            .rollout_id)
    }

    fn count(ctx: &mut Ctx) -> u64 {
        ctx.statistics().unwrap().total_rollouts
    }

    #[test]
    fn an_operation_failing_after_writing_rolls_back_its_transaction_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = ctx(&dir);
        let (finished, _rx) = watch::channel(0);
        let (a, a_rx) = job(enqueue);
        let (b, b_rx) = job(|ctx, now| -> Result<(), StoreError> {
            enqueue(ctx, now)?;
            Err(StoreError::Backend("disk on fire".into()))
        });
        let (c, c_rx) = job(enqueue);
        let mut jobs = vec![a, b, c];
        run_batch(&mut ctx, &mut jobs, &finished, &mut || None);
        // `a` shared the rolled-back transaction: it is told so, and its rollout is gone.
        let a_err = a_rx.blocking_recv().unwrap().unwrap_err().to_string();
        assert!(
            a_err.contains("rolled back") && a_err.contains("disk on fire"),
            "{a_err}"
        );
        assert_eq!(
            b_rx.blocking_recv().unwrap().unwrap_err(),
            StoreError::Backend("disk on fire".into())
        );
        // `c` ran in a fresh transaction and is committed.
        let c_id = c_rx.blocking_recv().unwrap().unwrap();
        assert_eq!(count(&mut ctx), 1);
        assert!(ctx.get_rollout(&c_id).unwrap().is_some());
    }

    #[test]
    fn a_refused_operation_does_not_disturb_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = ctx(&dir);
        let (finished, _rx) = watch::channel(0);
        let (a, a_rx) = job(enqueue);
        let (b, b_rx) = job(|ctx, now| ctx.start_attempt("ro-missing", None, now));
        let (c, c_rx) = job(enqueue);
        let mut jobs = vec![a, b, c];
        run_batch(&mut ctx, &mut jobs, &finished, &mut || None);
        assert!(a_rx.blocking_recv().unwrap().is_ok());
        assert!(matches!(
            b_rx.blocking_recv().unwrap(),
            Err(StoreError::NotFound { .. })
        ));
        assert!(c_rx.blocking_recv().unwrap().is_ok());
        assert_eq!(count(&mut ctx), 2);
    }

    #[test]
    fn finishing_a_rollout_wakes_waiters_after_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = ctx(&dir);
        let (finished, mut seen) = watch::channel(0);
        let (a, a_rx) = job(|ctx, now| {
            let r = ctx.start_rollout(EnqueueRolloutRequest::new(json!(1)), None, now)?;
            ctx.update_attempt(
                &r.rollout.rollout_id,
                "latest",
                &crate::store::AttemptUpdate {
                    status: Some(agl_core::AttemptStatus::Succeeded),
                    ..Default::default()
                },
                now,
            )
        });
        let mut jobs = vec![a];
        run_batch(&mut ctx, &mut jobs, &finished, &mut || None);
        assert!(a_rx.blocking_recv().unwrap().is_ok());
        assert!(seen.has_changed().unwrap());
        assert_eq!(*seen.borrow_and_update(), 1);
    }
}
