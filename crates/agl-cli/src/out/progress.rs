//! The progress bar on stderr that `agl train` and `agl eval` show while rollouts run.
//!
//! Not for what is counted (the caller moves the bar) or for the messages beside it.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar for `total` items, prefixed `prefix`, its position right-aligned in
/// `pos_width` columns (`agl train`'s scorer: 6; the LLM agent's rollouts: 5).
pub fn progress_bar(prefix: &str, total: u64, pos_width: usize) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(&template(pos_width))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(prefix.to_string());
    bar
}

/// indicatif's template of the bar.
fn template(pos_width: usize) -> String {
    format!("{{prefix:>8}} [{{bar:30}}] {{pos:>{pos_width}}}/{{len}} {{msg}} ({{elapsed}})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_are_the_ones_the_commands_always_showed() {
        assert_eq!(
            template(6),
            "{prefix:>8} [{bar:30}] {pos:>6}/{len} {msg} ({elapsed})"
        );
        assert_eq!(
            template(5),
            "{prefix:>8} [{bar:30}] {pos:>5}/{len} {msg} ({elapsed})"
        );
        assert!(ProgressStyle::with_template(&template(5)).is_ok());
    }
}
