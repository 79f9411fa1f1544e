//! Prompt templates of the `f-string` engine: the subset of Python's `str.format` that Agent
//! Lightning's `PromptTemplate(engine="f-string").format(**kwargs)` uses with keyword
//! arguments.
//!
//! Accepted: literal text, `{name}` (a Python identifier, replaced by the value given for
//! `name`), `{{` (a literal `{`) and `}}` (a literal `}`). Refused, with the line and column
//! (1-based, in characters) of the field's `{`: a positional field (`{}`, `{0}`), a
//! conversion (`{name!r}`), a format spec (`{name:>10}`), attribute or index access
//! (`{user.name}`, `{rows[0]}`), a name that is not an identifier, an unclosed `{` and a single
//! `}`. Rendering needs a value for every field (Python raises `KeyError` otherwise); values
//! given for names the template does not use are ignored, as Python ignores extra keyword
//! arguments. Where a template is accepted, [`FStringTemplate::render`] gives what Python's
//! `template.format(**values)` gives for string values.
//!
//! Responsible for parsing and rendering; not for where templates are stored (resources) or
//! which names an agent provides (the agent).

use std::collections::BTreeSet;
use std::fmt;

/// Why a template was refused or could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prompt template, line {line}, column {column}: {reason}")]
pub struct TemplateError {
    /// 1-based line of the offending `{` or `}`.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What was wrong.
    pub reason: String,
}

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Literal text (with `{{`/`}}` already undoubled).
    Text(String),
    /// A field; its line and column for errors at render time.
    Field {
        name: String,
        line: usize,
        column: usize,
    },
}

/// A parsed `f-string` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FStringTemplate {
    source: String,
    pieces: Vec<Piece>,
}

impl FStringTemplate {
    /// Parses `source`, refusing what the module docs list.
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let (mut line, mut column) = (1usize, 0usize);
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            column += 1;
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    column += 1;
                    text.push('{');
                }
                '{' => {
                    let (at_line, at_column) = (line, column);
                    let err = |reason: String| TemplateError {
                        line: at_line,
                        column: at_column,
                        reason,
                    };
                    let mut field = String::new();
                    let mut closed = false;
                    for f in chars.by_ref() {
                        if f == '\n' {
                            line += 1;
                            column = 0;
                        } else {
                            column += 1;
                        }
                        if f == '}' {
                            closed = true;
                            break;
                        }
                        field.push(f);
                    }
                    if !closed {
                        return Err(err(
                            "`{` is never closed (write `{{` for a literal brace)".into()
                        ));
                    }
                    check_field(&field).map_err(err)?;
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Field {
                        name: field,
                        line: at_line,
                        column: at_column,
                    });
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    column += 1;
                    text.push('}');
                }
                '}' => {
                    return Err(TemplateError {
                        line,
                        column,
                        reason: "a single `}` (write `}}` for a literal brace)".into(),
                    });
                }
                '\n' => {
                    line += 1;
                    column = 0;
                    text.push('\n');
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Self {
            source: source.to_string(),
            pieces,
        })
    }

    /// The template text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The field names, sorted, each once.
    pub fn placeholders(&self) -> BTreeSet<&str> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Field { name, .. } => Some(name.as_str()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    /// Renders with `value(name)` for each field; a field without a value is an error naming
    /// it and its position.
    pub fn render_with<'v>(
        &self,
        mut value: impl FnMut(&str) -> Option<&'v str>,
    ) -> Result<String, TemplateError> {
        let mut out = String::with_capacity(self.source.len());
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field { name, line, column } => match value(name) {
                    Some(v) => out.push_str(v),
                    None => {
                        return Err(TemplateError {
                            line: *line,
                            column: *column,
                            reason: format!("no value for the field `{{{name}}}`"),
                        });
                    }
                },
            }
        }
        Ok(out)
    }

    /// Renders with the `(name, value)` pairs (the first pair of a name wins; unused pairs are
    /// ignored).
    pub fn render(&self, values: &[(&str, &str)]) -> Result<String, TemplateError> {
        self.render_with(|name| values.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
    }
}

impl fmt::Display for FStringTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Whether a field's text is a keyword field agl renders; the reason otherwise.
fn check_field(field: &str) -> Result<(), String> {
    if field.is_empty() {
        return Err(
            "`{}` is a positional field; name it (e.g. `{question}`) or write `{{}}` for \
             literal braces"
                .into(),
        );
    }
    if let Some(i) = field.find(['!', ':']) {
        let (name, rest) = field.split_at(i);
        let what = if rest.starts_with('!') {
            "a conversion"
        } else {
            "a format spec"
        };
        return Err(format!(
            "`{{{field}}}` has {what} (`{rest}`); only plain `{{{name}}}` fields are rendered"
        ));
    }
    if field.contains(['.', '[']) {
        return Err(format!(
            "`{{{field}}}` uses attribute or index access; only plain `{{name}}` fields are \
             rendered"
        ));
    }
    if field.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "`{{{field}}}` is a positional field; name it (e.g. `{{question}}`)"
        ));
    }
    let mut chars = field.chars();
    let first_ok = chars.next().is_some_and(|c| c == '_' || c.is_alphabetic());
    if !first_ok || !chars.all(|c| c == '_' || c.is_alphanumeric()) {
        return Err(format!(
            "`{{{field}}}` is not a field name (letters, digits and `_`, not starting with a \
             digit); write `{{{{` and `}}}}` for literal braces"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_fields_and_doubled_braces_as_python_does() {
        // Python: "Q: {question}\n{{\"a\": {n}}} {question}".format(question="why?", n="1")
        let t = FStringTemplate::parse("Q: {question}\n{{\"a\": {n}}} {question}").unwrap();
        assert_eq!(
            t.render(&[("question", "why?"), ("n", "1"), ("extra", "x")])
                .unwrap(),
            "Q: why?\n{\"a\": 1} why?"
        );
        assert_eq!(
            t.placeholders().into_iter().collect::<Vec<_>>(),
            ["n", "question"]
        );
        // A value holding braces is inserted as it is (format does not re-parse it).
        assert_eq!(
            FStringTemplate::parse("{a}")
                .unwrap()
                .render(&[("a", "{b}}")])
                .unwrap(),
            "{b}}"
        );
        assert_eq!(FStringTemplate::parse("").unwrap().render(&[]).unwrap(), "");
        assert_eq!(
            FStringTemplate::parse("{naïve_1}")
                .unwrap()
                .render(&[("naïve_1", "ok")])
                .unwrap(),
            "ok"
        );
    }

    #[test]
    fn refuses_what_it_does_not_render_naming_the_position() {
        let cases = [
            ("a {}", 1, 3, "positional"),
            ("a\nb {0}", 2, 3, "positional"),
            ("{q!r}", 1, 1, "conversion"),
            ("x{q:>10}", 1, 2, "format spec"),
            ("{user.name}", 1, 1, "attribute or index"),
            ("{rows[0]}", 1, 1, "attribute or index"),
            ("{two words}", 1, 1, "not a field name"),
            ("{1x}", 1, 1, "not a field name"),
            ("ok }", 1, 4, "single `}`"),
            ("ok {q", 1, 4, "never closed"),
        ];
        for (src, line, column, what) in cases {
            let e = FStringTemplate::parse(src).unwrap_err();
            assert_eq!((e.line, e.column), (line, column), "{src:?}: {e}");
            assert!(e.to_string().contains(what), "{src:?}: {e}");
        }
    }

    #[test]
    fn a_missing_value_names_the_field_and_where_it_is() {
        let t = FStringTemplate::parse("Schema:\n  {schema}\n{question}").unwrap();
        let e = t.render(&[("question", "q")]).unwrap_err();
        assert_eq!((e.line, e.column), (2, 3));
        assert!(e.to_string().contains("`{schema}`"), "{e}");
    }
}
