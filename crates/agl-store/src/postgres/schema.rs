//! The PostgreSQL schema of the store, its migrations and the checks made when a database is
//! opened.
//!
//! Responsible for deciding whether a PostgreSQL schema (namespace) may be used as a store (an
//! absent or empty one, or an agl store of a version this build knows), and for bringing an
//! older agl store up to [`SCHEMA_VERSION`] inside one transaction. Not responsible for reading
//! or writing entities.
//!
//! One store lives in one PostgreSQL schema, named after its **partition**
//! ([`schema_name`]: `agl_` + the partition), so several trainings can share one database
//! without seeing each other's rollouts. A store is recognised by its `agl_meta` table
//! (`application` = [`APPLICATION`], `schema_version`). A schema that holds anything else is
//! **never modified**: the checks only read the catalogue before anything is written.
//!
//! Several `agl store` servers may open the same store at once: the check and the migration
//! run under a transaction-level advisory lock keyed by the schema name, so exactly one of
//! them creates or migrates it and the others see the result.
//!
//! The tables mirror the SQLite backend's (see `crate::sqlite`): creation order is each
//! table's identity column `seq`; JSON columns are `TEXT` (not `jsonb`, which would reorder
//! object keys that clients read back byte for byte); times are `DOUBLE PRECISION` Unix
//! seconds.

use tokio_postgres::GenericClient;

use crate::error::StoreError;

/// `agl_meta.application` of an agl store.
pub const APPLICATION: &str = "agl-store";

/// Version 1: every table and index of the store (the SQLite backend's version 2 layout).
const V1: &str = r#"
CREATE TABLE rollouts (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id     TEXT    NOT NULL UNIQUE,
    input          TEXT    NOT NULL,
    start_time     DOUBLE PRECISION NOT NULL,
    end_time       DOUBLE PRECISION,
    mode           TEXT,
    resources_id   TEXT,
    status         TEXT    NOT NULL,
    config         TEXT    NOT NULL,
    metadata       TEXT,
    watched        BOOLEAN NOT NULL DEFAULT FALSE,
    attempt_count  BIGINT  NOT NULL DEFAULT 0,
    span_sequence  BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX rollouts_by_status ON rollouts(status);
CREATE INDEX rollouts_watched ON rollouts(watched) WHERE watched;
CREATE INDEX rollouts_by_start ON rollouts(start_time DESC, seq);
CREATE INDEX rollouts_by_end ON rollouts(end_time DESC NULLS FIRST, seq);
CREATE INDEX rollouts_by_mode_start ON rollouts(mode, start_time DESC, seq);

CREATE TABLE attempts (
    seq                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_seq         BIGINT NOT NULL REFERENCES rollouts(seq),
    rollout_id          TEXT   NOT NULL,
    attempt_id          TEXT   NOT NULL,
    sequence_id         BIGINT NOT NULL,
    start_time          DOUBLE PRECISION NOT NULL,
    end_time            DOUBLE PRECISION,
    status              TEXT   NOT NULL,
    worker_id           TEXT,
    last_heartbeat_time DOUBLE PRECISION,
    metadata            TEXT,
    UNIQUE (rollout_seq, sequence_id),
    UNIQUE (rollout_seq, attempt_id)
);

CREATE TABLE spans (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_seq  BIGINT NOT NULL REFERENCES rollouts(seq),
    attempt_id   TEXT   NOT NULL,
    span_id      TEXT   NOT NULL,
    body         TEXT   NOT NULL,
    UNIQUE (rollout_seq, attempt_id, span_id)
);
CREATE INDEX spans_by_rollout ON spans(rollout_seq, seq);

CREATE TABLE queue (
    pos          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_seq  BIGINT NOT NULL UNIQUE REFERENCES rollouts(seq)
);

CREATE TABLE workers (
    seq                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker_id           TEXT NOT NULL UNIQUE,
    status              TEXT NOT NULL,
    heartbeat_stats     TEXT,
    last_heartbeat_time DOUBLE PRECISION,
    last_dequeue_time   DOUBLE PRECISION,
    last_busy_time      DOUBLE PRECISION,
    last_idle_time      DOUBLE PRECISION,
    current_rollout_id  TEXT,
    current_attempt_id  TEXT
);

CREATE TABLE resources (
    seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resources_id  TEXT   NOT NULL UNIQUE,
    create_time   DOUBLE PRECISION NOT NULL,
    update_time   DOUBLE PRECISION NOT NULL,
    version       BIGINT NOT NULL,
    resources     TEXT   NOT NULL
);

CREATE TABLE orphan_sequences (
    rollout_id  TEXT PRIMARY KEY,
    value       BIGINT NOT NULL
);
"#;

/// The migrations, in order: `MIGRATIONS[i]` brings a store from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Longest partition name, bytes (PostgreSQL identifiers are at most 63 bytes).
pub const MAX_PARTITION_BYTES: usize = 48;

/// The PostgreSQL schema of `partition`: `agl_` + the partition.
///
/// # Errors
/// [`StoreError::Invalid`] unless the partition is 1 to [`MAX_PARTITION_BYTES`] characters
/// among `a-z`, `0-9` and `_` (so the name never needs quoting and means the same to every
/// client).
pub fn schema_name(partition: &str) -> Result<String, StoreError> {
    let ok = !partition.is_empty()
        && partition.len() <= MAX_PARTITION_BYTES
        && partition
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(format!("agl_{partition}"))
    } else {
        Err(StoreError::Invalid(format!(
            "partition `{partition}` must be 1 to {MAX_PARTITION_BYTES} characters among a-z, \
             0-9 and _"
        )))
    }
}

fn backend(schema: &str, what: &str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    let at = format!("postgres store (schema `{schema}`): {what}");
    move |e| StoreError::Backend(format!("{at}: {e}"))
}

/// What the catalogue says about a schema before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// No such schema, or one without tables, views or sequences: a new store.
    Empty { exists: bool },
    /// An agl store of this version or an older one.
    Store { version: i64 },
}

/// Reads the catalogue and refuses what is not an agl store this build can use.
async fn inspect<C: GenericClient>(client: &C, schema: &str) -> Result<Found, StoreError> {
    let exists = client
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await
        .map_err(backend(schema, "reading the catalogue"))?
        .is_some();
    let relations: Vec<String> = client
        .query(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'm', 'p', 'f')",
            &[&schema],
        )
        .await
        .map_err(backend(schema, "reading the catalogue"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if relations.is_empty() {
        return Ok(Found::Empty { exists });
    }
    if !relations.iter().any(|r| r == "agl_meta") {
        let mut shown = relations.clone();
        shown.sort();
        shown.truncate(5);
        return Err(StoreError::Backend(format!(
            "schema `{schema}` holds tables that are not an agl store ({}); it was left \
             untouched: choose another partition or database",
            shown.join(", ")
        )));
    }
    let rows = client
        .query(&format!("SELECT key, value FROM {schema}.agl_meta"), &[])
        .await
        .map_err(backend(schema, "reading agl_meta"))?;
    let value = |key: &str| {
        rows.iter()
            .find(|r| r.get::<_, String>(0) == key)
            .map(|r| r.get::<_, String>(1))
    };
    if value("application").as_deref() != Some(APPLICATION) {
        return Err(StoreError::Backend(format!(
            "schema `{schema}` has an agl_meta table that is not an agl store's; it was left \
             untouched"
        )));
    }
    let version = value("schema_version")
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| *v >= 1)
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "postgres store (schema `{schema}`) has no valid schema_version in agl_meta"
            ))
        })?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "postgres store (schema `{schema}`) has schema version {version}, newer than version \
             {SCHEMA_VERSION} that this build of agl knows; upgrade agl to open it"
        )));
    }
    Ok(Found::Store { version })
}

/// Refuses a schema that holds no agl store (absent or empty) without creating anything, and
/// anything [`prepare`] would refuse; the check of an open that must not create a store
/// (`agl store inspect`).
pub(crate) async fn require_store<C: GenericClient>(
    client: &C,
    schema: &str,
) -> Result<(), StoreError> {
    match inspect(client, schema).await? {
        Found::Store { .. } => Ok(()),
        Found::Empty { exists } => Err(StoreError::Backend(format!(
            "no agl store in schema `{schema}` (the schema {}); nothing was created: check the \
             database and the partition",
            if exists { "is empty" } else { "does not exist" }
        ))),
    }
}

/// Opens the store in `schema`: creates it in an empty or absent schema, migrates an older
/// one, refuses anything else untouched. Returns the version found before (0 = created).
///
/// # Errors
/// [`StoreError::Backend`] for a schema that is not an agl store, a newer store, or a failing
/// database (nothing is left half-written: it all runs in one transaction).
pub async fn prepare(client: &mut tokio_postgres::Client, schema: &str) -> Result<i64, StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(backend(schema, "starting the schema transaction"))?;
    // One opener at a time per schema, across servers; released at commit or rollback.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&format!("agl-store:{schema}")],
    )
    .await
    .map_err(backend(schema, "taking the schema lock"))?;
    let found = inspect(&tx, schema).await?;
    let from = match found {
        Found::Store { version } => version,
        Found::Empty { exists } => {
            if !exists {
                tx.batch_execute(&format!("CREATE SCHEMA {schema}"))
                    .await
                    .map_err(backend(schema, "creating the schema"))?;
            }
            tx.batch_execute(&format!(
                "CREATE TABLE {schema}.agl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
                 INSERT INTO {schema}.agl_meta VALUES ('application', '{APPLICATION}'), \
                 ('schema_version', '0');"
            ))
            .await
            .map_err(backend(schema, "creating agl_meta"))?;
            0
        }
    };
    if from < SCHEMA_VERSION {
        tx.batch_execute(&format!("SET LOCAL search_path TO {schema}"))
            .await
            .map_err(backend(schema, "selecting the schema"))?;
        for (i, step) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            tx.batch_execute(step)
                .await
                .map_err(backend(schema, &format!("migrating to version {}", i + 1)))?;
        }
        tx.execute(
            &format!("UPDATE {schema}.agl_meta SET value = $1 WHERE key = 'schema_version'"),
            &[&SCHEMA_VERSION.to_string()],
        )
        .await
        .map_err(backend(schema, "recording the schema version"))?;
    }
    tx.commit()
        .await
        .map_err(backend(schema, "committing the schema"))?;
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_name_schemas_that_need_no_quoting() {
        assert_eq!(schema_name("main").unwrap(), "agl_main");
        assert_eq!(schema_name("run_2026_11").unwrap(), "agl_run_2026_11");
        for bad in ["", "Main", "a-b", "a b", "x;drop", &"a".repeat(49)] {
            let e = schema_name(bad).unwrap_err().to_string();
            assert!(e.contains("partition"), "{bad}: {e}");
        }
    }
}
