//! The PostgreSQL store's address: a libpq connection URL (`postgres://user@host:port/db`, as
//! `psql` takes it) with one agl parameter, `partition` (default [`DEFAULT_PARTITION`]), the
//! store inside that database (see [`super::schema`]).
//!
//! `partition` is removed from the URL before the rest is handed to tokio-postgres, which
//! refuses parameters it does not know; every other parameter keeps its libpq meaning.

use std::str::FromStr;

use crate::error::StoreError;

/// The partition of a URL that names none.
pub const DEFAULT_PARTITION: &str = "main";

/// Where a PostgreSQL store lives.
#[derive(Clone)]
pub struct PostgresUrl {
    /// The connection settings (the URL without `partition`).
    pub config: tokio_postgres::Config,
    /// The partition (checked by [`super::schema::schema_name`]).
    pub partition: String,
    /// The PostgreSQL schema of the partition.
    pub schema: String,
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio-postgres' Config redacts the password in its Debug output.
        f.debug_struct("PostgresUrl")
            .field("config", &self.config)
            .field("partition", &self.partition)
            .finish()
    }
}

/// Whether `spec` names a PostgreSQL store (`postgres://` or `postgresql://`).
pub fn is_postgres_url(spec: &str) -> bool {
    crate::address::is_postgres_address(spec)
}

impl FromStr for PostgresUrl {
    type Err = StoreError;

    fn from_str(spec: &str) -> Result<Self, StoreError> {
        if !is_postgres_url(spec) {
            return Err(StoreError::Invalid(
                "a PostgreSQL store URL starts with postgres:// or postgresql://".into(),
            ));
        }
        let (base, query) = match spec.split_once('?') {
            Some((b, q)) => (b, q),
            None => (spec, ""),
        };
        let mut partition: Option<String> = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("partition", value)) => {
                    if partition.replace(value.to_string()).is_some() {
                        return Err(StoreError::Invalid(
                            "the store URL names `partition` twice".into(),
                        ));
                    }
                }
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let config = tokio_postgres::Config::from_str(&rest).map_err(|e| {
            StoreError::Invalid(format!("the PostgreSQL store URL does not parse: {e}"))
        })?;
        let partition = partition.unwrap_or_else(|| DEFAULT_PARTITION.to_string());
        let schema = super::schema::schema_name(&partition)?;
        Ok(PostgresUrl {
            config,
            partition,
            schema,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partition_is_taken_out_and_the_rest_is_libpq() {
        let u: PostgresUrl = "postgres://agl@127.0.0.1:5433/runs?partition=exp_1&connect_timeout=5"
            .parse()
            .unwrap();
        assert_eq!(u.partition, "exp_1");
        assert_eq!(u.schema, "agl_exp_1");
        assert_eq!(u.config.get_user(), Some("agl"));
        assert_eq!(u.config.get_dbname(), Some("runs"));
        assert_eq!(u.config.get_ports(), &[5433]);
        assert_eq!(
            u.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(5))
        );
        let d: PostgresUrl = "postgresql://h/db".parse().unwrap();
        assert_eq!(
            (d.partition.as_str(), d.schema.as_str()),
            ("main", "agl_main")
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (spec, needle) in [
            ("mysql://h/db", "starts with postgres://"),
            ("postgres://h/db?partition=a&partition=b", "twice"),
            ("postgres://h/db?partition=Bad-Name", "partition `Bad-Name`"),
            ("postgres://h/db?partition=", "partition ``"),
            ("postgres://h/db?sslmode=sometimes", "does not parse"),
        ] {
            let e = spec.parse::<PostgresUrl>().unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }

    #[test]
    fn passwords_stay_out_of_debug_output() {
        let u: PostgresUrl = "postgres://agl:s3cret@h/db".parse().unwrap();
        assert!(!format!("{u:?}").contains("s3cret"));
    }
}
