//! The comparison tables `agl train` prints: one row per metric, a label, the untrained
//! column, then one column per training run.
//!
//! Not for what the rows hold (each command picks its metrics and formats its numbers).

/// The column layout of a comparison table: the label left-aligned in `label` characters, the
/// untrained cell and each run's cell right-aligned in `first` and `cell` characters, every
/// cell after the label preceded by `sep`.
#[derive(Debug, Clone, Copy)]
pub struct Columns {
    /// Width of the label column.
    pub label: usize,
    /// Width of the untrained column.
    pub first: usize,
    /// Width of each run's column.
    pub cell: usize,
    /// What goes before every column after the label.
    pub sep: &'static str,
}

impl Columns {
    /// One line of the table.
    pub fn line(
        &self,
        label: &str,
        first: &str,
        cells: impl IntoIterator<Item = String>,
    ) -> String {
        let Self {
            label: lw,
            first: fw,
            cell: cw,
            sep,
        } = *self;
        let mut line = format!("{label:<lw$}{sep}{first:>fw$}");
        for c in cells {
            line.push_str(&format!("{sep}{c:>cw$}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_aligned_with_their_separator() {
        let tight = Columns {
            label: 6,
            first: 4,
            cell: 4,
            sep: "",
        };
        assert_eq!(
            tight.line("acc", "0.1", ["0.2".into(), "0.3".into()]),
            "acc    0.1 0.2 0.3"
        );
        let spaced = Columns {
            label: 4,
            first: 3,
            cell: 5,
            sep: " ",
        };
        assert_eq!(spaced.line("a", "b", ["c".into()]), "a      b     c");
    }
}
