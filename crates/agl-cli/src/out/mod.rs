//! What the commands print and write: progress bars, comparison tables, report files, plots and
//! the process's peak memory. Each helper is defined once here so that every command's output looks the same.
//!
//! Not for what is measured or reported (the commands and the libraries decide that).

pub mod files;
pub mod plot;
pub mod progress;
pub mod rss;
pub mod table;
