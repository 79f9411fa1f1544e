//! Flag groups that several commands share, each declared once, and the value parsers they
//! use.
//!
//! Not for the flags that belong to one command (they live with it under `cmd/`) or for what
//! the flags do.

pub mod data;
pub mod engine;
pub mod gateway;
pub mod store;

/// clap value parser for the library's named enums (`GovernanceMode`, `SqlDialect`, …): their
/// `FromStr` errors already list the valid names.
pub fn parse_name<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| e.to_string())
}
