//! The prompts and reply parsing of the SQL-writing LLM agent on Spider.
//!
//! The agent follows Agent Lightning's `examples/spider` workflow (write → execute → check →
//! rewrite → execute → check …; see `agl_spider::sql_agent`), with prompts of our own:
//! - **write** ([`write_messages`]): a system prompt for an agent that writes one SQLite query,
//!   with the rules (only tables and columns of the schema, one read-only statement), the
//!   schema ([`render_schema`], at most [`SCHEMA_MAX_CHARS`] characters) and the output format
//!   (exactly one fenced ```` ```sql ```` block); the user message is the question, from the
//!   `f-string` template [`WRITE_USER_TEMPLATE`] unless the rollout's resources hold another
//!   ([`write_messages_with`]: the template APO optimises, with the fields `{question}` and
//!   `{schema}`);
//! - **check** ([`check_messages`]): an "SQL expert" reviews the query against a checklist of
//!   common mistakes and the execution result ([`render_result`], at most
//!   [`RESULT_MAX_CHARS`] characters), must not write a fixed query, and ends with an all-caps
//!   verdict, `THE QUERY IS CORRECT` or `THE QUERY IS INCORRECT` ([`parse_verdict`]);
//! - **rewrite** ([`rewrite_messages`]): the write prompt plus the previous query, its result
//!   and the checker's feedback.
//!
//! Replies are read with [`extract_sql`] (the last ```` ```sql ```` block, else the last fenced
//! block, else the text from the first `SELECT`/`WITH`).
//!
//! Responsible for text only: every function here is pure. Not responsible for calling a model,
//! running SQL or governance (the agent in `agl-train` does those).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::executor::{ResultSet, Value};
use crate::schema::DbInfo;
use crate::sql::quote_ident;

/// The SQL dialect named in the prompts.
pub const DIALECT: &str = "SQLite";

/// Most characters (Unicode scalar values) of the schema block in a prompt; longer schemas are
/// cut and marked with [`TRUNCATION_MARK`].
pub const SCHEMA_MAX_CHARS: usize = 2048;

/// Most characters of an execution result in a prompt; longer results are cut and marked with
/// [`TRUNCATION_MARK`].
pub const RESULT_MAX_CHARS: usize = 2048;

/// Most result rows listed in a prompt before the rest is summarised as a count.
pub const RESULT_MAX_ROWS: usize = 20;

/// Appended (on its own line) to text cut by [`truncate_chars`].
pub const TRUNCATION_MARK: &str = "... (truncated)";

/// One chat message: `role` (`system`, `user`, or `assistant` in a demonstration) and
/// `content`, as in OpenAI's Chat Completions API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl PromptMessage {
    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }

    /// An `assistant` message (a demonstration's answer).
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".into(),
            content: content.into(),
        }
    }
}

/// The answer the write prompt asks for: `sql` (trimmed) in a ```` ```sql ```` block, which
/// [`extract_sql`] reads back unchanged (a demonstration's assistant message).
pub fn write_answer(sql: &str) -> String {
    fenced(sql)
}

/// The checker's verdict on a query. JSON: `"correct"`, `"incorrect"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckVerdict {
    /// The checker found the query correct: the agent stops.
    Correct,
    /// The checker found a mistake: the agent rewrites (while turns remain).
    Incorrect,
}

/// `text` cut to at most `max_chars` characters (Unicode scalar values, never inside one),
/// with a final line [`TRUNCATION_MARK`] when anything was cut. The mark is not counted.
pub fn truncate_chars(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}\n{TRUNCATION_MARK}", &text[..cut]),
    }
}

/// The schema block of the prompts: one `Table name: col, col, … (N rows)` line per table in
/// `sqlite_master` order, then, when the database declares any, a `Foreign keys:` line and one
/// `table.column = ref_table.ref_column` line per foreign-key column (the join conditions);
/// cut at [`SCHEMA_MAX_CHARS`] characters. Identifiers that need it are double-quoted, so the
/// model sees how to write them. Column types are not listed ([`DbInfo`] does not carry them).
/// Not `CREATE TABLE` statements: measured with the 135M built-in model, a DDL schema made it
/// copy `CREATE TABLE` lines as its answer. The foreign keys carry what Agent Lightning's Spider
/// agent sees in LangChain's `get_table_info()` DDL and a column list alone does not: which
/// column joins which table (docs/training.md measures what they changed).
pub fn render_schema(info: &DbInfo) -> String {
    let mut out = String::new();
    for t in &info.tables {
        let cols: Vec<String> = t.columns.iter().map(|c| quote_ident(c)).collect();
        let _ = writeln!(
            out,
            "Table {}: {} ({} row{})",
            quote_ident(&t.name),
            cols.join(", "),
            t.rows,
            if t.rows == 1 { "" } else { "s" }
        );
    }
    let mut fks = info
        .tables
        .iter()
        .flat_map(|t| t.foreign_keys.iter().map(move |k| (t, k)))
        .peekable();
    if fks.peek().is_some() {
        out.push_str("Foreign keys:\n");
        for (t, k) in fks {
            let _ = writeln!(
                out,
                "{}.{} = {}.{}",
                quote_ident(&t.name),
                quote_ident(&k.column),
                quote_ident(&k.ref_table),
                quote_ident(&k.ref_column)
            );
        }
    }
    truncate_chars(out.trim_end(), SCHEMA_MAX_CHARS)
}

fn render_value(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Integer(i) => i.to_string(),
        Value::Real(f) => f.to_string(),
        Value::Text(s) => format!("'{}'", s.replace('\'', "''")),
        Value::Blob(b) => format!("<blob of {} bytes>", b.len()),
    }
}

/// An execution result for the prompts: a count line (`N rows, C columns`), then up to
/// [`RESULT_MAX_ROWS`] rows as SQL-literal tuples (`(1, 'a', NULL)`), then `… and K more
/// rows`; cut at [`RESULT_MAX_CHARS`] characters.
pub fn render_result(result: &ResultSet) -> String {
    let n = result.rows.len();
    let mut out = format!(
        "{n} row{}, {} column{}",
        if n == 1 { "" } else { "s" },
        result.columns,
        if result.columns == 1 { "" } else { "s" }
    );
    for row in result.rows.iter().take(RESULT_MAX_ROWS) {
        let vals: Vec<String> = row.iter().map(render_value).collect();
        let _ = write!(out, "\n({})", vals.join(", "));
    }
    if n > RESULT_MAX_ROWS {
        let _ = write!(out, "\n... and {} more rows", n - RESULT_MAX_ROWS);
    }
    truncate_chars(&out, RESULT_MAX_CHARS)
}

const OUTPUT_FORMAT: &str = "Output format: answer with exactly one fenced code block that \
holds the query, and nothing else:\n```sql\nSELECT ...\n```";

fn writer_system(schema: &str) -> String {
    format!(
        "You are an agent that answers questions about a {DIALECT} database by writing one \
syntactically correct {DIALECT} query.\n\n\
Rules:\n\
- Use only the tables and columns listed in the schema below. Never invent a table or a \
column, and check which table each column belongs to.\n\
- Select only the columns the question asks for.\n\
- Write one read-only statement (SELECT, or WITH ... SELECT). Never modify the database: no \
INSERT, UPDATE, DELETE, DROP, ALTER or CREATE.\n\
- Double-quote identifiers that contain spaces or other special characters.\n\n\
Schema:\n{schema}\n\n{OUTPUT_FORMAT}"
    )
}

fn fenced(sql: &str) -> String {
    format!("```sql\n{}\n```", sql.trim())
}

/// Ends the write prompt's user message: small models follow the output format far more
/// often when it is repeated next to the question.
const ANSWER_REMINDER: &str = "Answer with one SQLite query in a ```sql block.";

/// The write prompt's user message as an `f-string` template (Python `str.format`, fields
/// `{question}` and `{schema}`): what [`write_messages`] writes, and the seed of APO.
pub const WRITE_USER_TEMPLATE: &str =
    "Question: {question}\nAnswer with one SQLite query in a ```sql block.";

/// The fields a write template may use.
pub const WRITE_TEMPLATE_FIELDS: [&str; 2] = ["question", "schema"];

/// Parses a write template (a user's or an optimiser's) and checks that it uses only
/// [`WRITE_TEMPLATE_FIELDS`]; the error names the position of a syntax error or the field.
pub fn parse_write_template(text: &str) -> Result<agl_core::FStringTemplate, String> {
    let t = agl_core::FStringTemplate::parse(text).map_err(|e| e.to_string())?;
    if let Some(f) = t
        .placeholders()
        .into_iter()
        .find(|f| !WRITE_TEMPLATE_FIELDS.contains(f))
    {
        return Err(format!(
            "the SQL agent fills only {{question}} and {{schema}}; the template has {{{f}}}"
        ));
    }
    Ok(t)
}

/// [`write_messages`] with the user message rendered from `template` (fields
/// [`WRITE_TEMPLATE_FIELDS`]: the question trimmed, the schema as given); with
/// [`WRITE_USER_TEMPLATE`] the result is byte-identical to [`write_messages`]'s.
///
/// # Errors
/// The template uses another field (the error names it and its line and column).
pub fn write_messages_with(
    template: &agl_core::FStringTemplate,
    schema: &str,
    question: &str,
) -> Result<Vec<PromptMessage>, agl_core::TemplateError> {
    let user = template.render(&[("question", question.trim()), ("schema", schema)])?;
    Ok(vec![
        PromptMessage::system(writer_system(schema)),
        PromptMessage::user(user),
    ])
}

/// The write prompt: the system prompt (dialect, rules, `schema` as given — render it with
/// [`render_schema`] — and the output format) and the user message `Question: <question>`
/// followed by a one-line reminder of the output format.
pub fn write_messages(schema: &str, question: &str) -> Vec<PromptMessage> {
    vec![
        PromptMessage::system(writer_system(schema)),
        PromptMessage::user(format!("Question: {}\n{ANSWER_REMINDER}", question.trim())),
    ]
}

/// The check prompt: an SQL expert reviews `query` for the question, with the checklist of
/// common mistakes and the schema in the system message, and the question, the query and
/// `result` (the execution result as [`render_result`] writes it, or an error text; cut at
/// [`RESULT_MAX_CHARS`] characters) in the user message. The reply must end with `THE QUERY
/// IS CORRECT` or `THE QUERY IS INCORRECT` and must not contain a fixed query.
pub fn check_messages(
    schema: &str,
    question: &str,
    query: &str,
    result: &str,
) -> Vec<PromptMessage> {
    let system = format!(
        "You are an SQL expert with a strong attention to detail. You review a {DIALECT} query \
written to answer a question, using the query's execution result.\n\n\
Check the query for these common mistakes:\n\
- using NOT IN with a subquery that can return NULL values;\n\
- using UNION when UNION ALL should have been used (or the reverse);\n\
- using BETWEEN for a range whose ends should be excluded;\n\
- data type mismatches in predicates (comparing text with numbers);\n\
- identifiers that need quoting and are not quoted, or string literals in double quotes;\n\
- calling a function with the wrong number of arguments;\n\
- missing or wrong casts to the data type the question needs;\n\
- joining on the wrong columns;\n\
- the query failing to execute (an error instead of a result);\n\
- a clearly unreasonable result (empty when the question expects rows, wrong columns, far too \
many rows).\n\
Also check that it answers exactly what the question asks.\n\n\
Schema:\n{schema}\n\n\
Answer with a short review: list the mistakes you find, if any. Do not write a corrected \
query. The last line of your answer must be the verdict in capital letters, exactly one of:\n\
THE QUERY IS CORRECT\n\
THE QUERY IS INCORRECT"
    );
    let user = format!(
        "Question: {}\n\nQuery:\n{}\n\nExecution result:\n{}",
        question.trim(),
        fenced(query),
        truncate_chars(result, RESULT_MAX_CHARS)
    );
    vec![PromptMessage::system(system), PromptMessage::user(user)]
}

/// The rewrite prompt: the write prompt's system message, and a user message with the
/// question, the previous `query`, its `result` (cut at [`RESULT_MAX_CHARS`] characters) and
/// the checker's `feedback`, asking for a corrected query in the same output format.
pub fn rewrite_messages(
    schema: &str,
    question: &str,
    query: &str,
    result: &str,
    feedback: &str,
) -> Vec<PromptMessage> {
    let user = format!(
        "Question: {}\n\nYour previous query:\n{}\n\nIts execution result:\n{}\n\n\
Feedback from a reviewer:\n{}\n\n\
Write an improved query that fixes the problems the feedback points out. If the feedback \
found no problem, repeat the query. {OUTPUT_FORMAT}",
        question.trim(),
        fenced(query),
        truncate_chars(result, RESULT_MAX_CHARS),
        feedback.trim()
    );
    vec![
        PromptMessage::system(writer_system(schema)),
        PromptMessage::user(user),
    ]
}

/// A fenced block of a reply: its info string (lowercase, e.g. `sql`) and its body.
struct Fence<'a> {
    lang: String,
    body: &'a str,
}

/// Every ```` ``` ```` block of `text` in order. A block left open at the end of the text (a
/// reply cut by the token limit) runs to the end.
fn fences(text: &str) -> Vec<Fence<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let (info, body_start) = match after.find('\n') {
            Some(nl) => (&after[..nl], nl + 1),
            None => (after, after.len()),
        };
        let body = &after[body_start..];
        let (body, next) = match body.find("```") {
            Some(close) => (&body[..close], &body[close + 3..]),
            None => (body, ""),
        };
        out.push(Fence {
            lang: info.trim().to_ascii_lowercase(),
            body,
        });
        rest = next;
    }
    out
}

/// Byte offset of the first `SELECT` or `WITH` keyword (any case, as a whole word) in `text`.
fn first_query_keyword(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if is_word(bytes[i]) && (i == 0 || !is_word(bytes[i - 1])) {
            let end = bytes[i..]
                .iter()
                .position(|&b| !is_word(b))
                .map_or(bytes.len(), |p| i + p);
            let word = &text[i..end];
            if word.eq_ignore_ascii_case("select") || word.eq_ignore_ascii_case("with") {
                return Some(i);
            }
            i = end;
        } else {
            i += 1;
        }
    }
    None
}

/// The SQL of a model reply, trimmed: the body of the last ```` ```sql ```` (or
/// ```` ```sqlite ````) block; else the body of the last fenced block of any language; else
/// the text from the first `SELECT` or `WITH` keyword (any case, whole word) to the end.
/// `None` when none of these holds any non-blank text.
pub fn extract_sql(reply: &str) -> Option<String> {
    let blocks = fences(reply);
    let non_blank = |s: &str| {
        let t = s.trim();
        (!t.is_empty()).then(|| t.to_string())
    };
    if let Some(sql) = blocks
        .iter()
        .rev()
        .filter(|f| f.lang == "sql" || f.lang == "sqlite")
        .find_map(|f| non_blank(f.body))
    {
        return Some(sql);
    }
    if let Some(sql) = blocks.iter().rev().find_map(|f| non_blank(f.body)) {
        return Some(sql);
    }
    let start = first_query_keyword(reply)?;
    non_blank(&reply[start..])
}

/// The checker's verdict in `reply`: the last all-caps word `CORRECT` or `INCORRECT` (whole
/// words, so `INCORRECT` never reads as `CORRECT`) decides; `NOT CORRECT` reads as
/// `INCORRECT`. Lowercase words do not count (the prompt asks for capitals, and a review says
/// "correct" in passing). `None` when there is no verdict; the agent treats that as not
/// correct, as Agent Lightning's example does.
pub fn parse_verdict(reply: &str) -> Option<CheckVerdict> {
    let words: Vec<&str> = reply
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate().rev() {
        match *w {
            "INCORRECT" => return Some(CheckVerdict::Incorrect),
            "CORRECT" => {
                let negated = i > 0 && words[i - 1] == "NOT";
                return Some(if negated {
                    CheckVerdict::Incorrect
                } else {
                    CheckVerdict::Correct
                });
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{ForeignKey, TableInfo};

    fn info() -> DbInfo {
        DbInfo {
            db_id: "concert_singer".into(),
            tables: vec![
                TableInfo {
                    name: "singer".into(),
                    columns: vec!["Singer_ID".into(), "Name".into(), "Song Name".into()],
                    rows: 6,
                    foreign_keys: vec![],
                },
                TableInfo {
                    name: "order".into(),
                    columns: vec!["id".into(), "singer".into()],
                    rows: 1,
                    foreign_keys: vec![ForeignKey {
                        column: "singer".into(),
                        ref_table: "singer".into(),
                        ref_column: "Singer_ID".into(),
                    }],
                },
            ],
        }
    }

    #[test]
    fn schema_lists_tables_in_order_and_quotes_what_needs_it() {
        let s = render_schema(&info());
        assert_eq!(
            s,
            "Table singer: Singer_ID, Name, \"Song Name\" (6 rows)\n\
             Table \"order\": id, singer (1 row)\n\
             Foreign keys:\n\
             \"order\".singer = singer.Singer_ID"
        );
        let mut no_keys = info();
        no_keys.tables[1].foreign_keys.clear();
        assert!(!render_schema(&no_keys).contains("Foreign keys"));
    }

    #[test]
    fn long_schema_is_cut_at_the_limit_on_a_char_boundary() {
        let wide = DbInfo {
            db_id: "w".into(),
            tables: (0..200)
                .map(|i| TableInfo {
                    name: format!("tablé_{i}"),
                    columns: vec!["ä".into(), "b".into()],
                    rows: 0,
                    foreign_keys: vec![],
                })
                .collect(),
        };
        let s = render_schema(&wide);
        let (body, mark) = s.rsplit_once('\n').unwrap();
        assert_eq!(mark, TRUNCATION_MARK);
        assert_eq!(body.chars().count(), SCHEMA_MAX_CHARS);
        // non-ASCII names are quoted (not plain identifiers)
        assert!(
            s.starts_with("Table \"tablé_0\": \"ä\", b (0 rows)\n"),
            "{s}"
        );
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(truncate_chars("héllo", 2), format!("hé\n{TRUNCATION_MARK}"));
    }

    #[test]
    fn result_lists_rows_as_literals_and_summarises_the_rest() {
        let r = ResultSet {
            columns: 2,
            rows: vec![
                vec![Value::Integer(1), Value::Text("O'Brien".into())],
                vec![Value::Null, Value::Real(2.5)],
            ],
        };
        assert_eq!(
            render_result(&r),
            "2 rows, 2 columns\n(1, 'O''Brien')\n(NULL, 2.5)"
        );
        let many = ResultSet {
            columns: 1,
            rows: (0..25).map(|i| vec![Value::Integer(i)]).collect(),
        };
        let text = render_result(&many);
        assert!(text.starts_with("25 rows, 1 column\n(0)\n"), "{text}");
        assert!(text.ends_with("(19)\n... and 5 more rows"), "{text}");
        let long = ResultSet {
            columns: 1,
            rows: vec![vec![Value::Text("x".repeat(5000))]],
        };
        assert!(render_result(&long).ends_with(TRUNCATION_MARK));
        assert_eq!(render_result(&ResultSet::default()), "0 rows, 0 columns");
    }

    #[test]
    fn prompts_carry_schema_question_query_result_and_feedback() {
        let w = write_messages("Table t: a (1 row)", " How many? ");
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].role, "system");
        assert!(w[0].content.contains("SQLite"));
        assert!(w[0].content.contains("Schema:\nTable t: a (1 row)"));
        assert!(w[0].content.contains("```sql"));
        assert_eq!(
            w[1].content,
            "Question: How many?\nAnswer with one SQLite query in a ```sql block."
        );

        let c = check_messages("S", "Q?", "SELECT 1;", &"r".repeat(3000));
        assert!(c[0].content.contains("NOT IN"));
        assert!(c[0].content.contains("UNION ALL"));
        assert!(c[0].content.contains("BETWEEN"));
        assert!(c[0].content.contains("Do not write a corrected query"));
        assert!(
            c[0].content
                .ends_with("THE QUERY IS CORRECT\nTHE QUERY IS INCORRECT")
        );
        assert!(c[1].content.contains("Query:\n```sql\nSELECT 1;\n```"));
        assert!(c[1].content.ends_with(TRUNCATION_MARK), "result is cut");

        let r = rewrite_messages("S", "Q?", "SELECT 2", "Error: no such table", "wrong table");
        assert_eq!(r[0], w_system("S"));
        assert!(r[1].content.contains("```sql\nSELECT 2\n```"));
        assert!(r[1].content.contains("Error: no such table"));
        assert!(
            r[1].content
                .contains("Feedback from a reviewer:\nwrong table")
        );
    }

    #[test]
    fn the_write_template_renders_the_write_prompt_and_names_unknown_fields() {
        let t = agl_core::FStringTemplate::parse(WRITE_USER_TEMPLATE).unwrap();
        assert_eq!(
            write_messages_with(&t, "Table t: a", " How many? ").unwrap(),
            write_messages("Table t: a", " How many? ")
        );
        let t = agl_core::FStringTemplate::parse("{schema}\n\n{question} {{sql}}").unwrap();
        assert_eq!(
            write_messages_with(&t, "S", "Q").unwrap()[1].content,
            "S\n\nQ {sql}"
        );
        let t = agl_core::FStringTemplate::parse("Q: {question}\nDB: {db}").unwrap();
        let e = write_messages_with(&t, "S", "Q").unwrap_err().to_string();
        assert!(
            e.contains("line 2, column 5") && e.contains("`{db}`"),
            "{e}"
        );
    }

    fn w_system(schema: &str) -> PromptMessage {
        write_messages(schema, "q").remove(0)
    }

    #[test]
    fn extract_prefers_the_last_sql_block() {
        let reply = "First try:\n```sql\nSELECT 1\n```\nBetter:\n```SQL\nSELECT name FROM singer;\n```\nDone.";
        assert_eq!(
            extract_sql(reply).as_deref(),
            Some("SELECT name FROM singer;")
        );
        // an sql block wins over a later block of another language
        let reply = "```sql\nSELECT a FROM t\n```\n```text\nnot sql\n```";
        assert_eq!(extract_sql(reply).as_deref(), Some("SELECT a FROM t"));
    }

    #[test]
    fn extract_falls_back_to_any_block_then_to_the_first_keyword() {
        assert_eq!(
            extract_sql("Here:\n```\nselect count(*) from t\n```").as_deref(),
            Some("select count(*) from t")
        );
        assert_eq!(
            extract_sql("The answer is SELECT name FROM singer WHERE age > 3").as_deref(),
            Some("SELECT name FROM singer WHERE age > 3")
        );
        assert_eq!(
            extract_sql("Sure. with x as (select 1) select * from x").as_deref(),
            Some("with x as (select 1) select * from x")
        );
        // `selected` is not the keyword
        assert_eq!(extract_sql("I selected nothing."), None);
        assert_eq!(extract_sql("no query here"), None);
        assert_eq!(extract_sql("```sql\n   \n```"), None);
    }

    #[test]
    fn extract_reads_a_block_cut_by_the_token_limit() {
        assert_eq!(
            extract_sql("```sql\nSELECT name FROM singer WHERE").as_deref(),
            Some("SELECT name FROM singer WHERE")
        );
    }

    #[test]
    fn extract_keeps_stacked_statements_for_governance_to_judge() {
        assert_eq!(
            extract_sql("```sql\nSELECT 1; DROP TABLE singer\n```").as_deref(),
            Some("SELECT 1; DROP TABLE singer")
        );
        assert_eq!(
            extract_sql("```sql\nDROP TABLE singer\n```").as_deref(),
            Some("DROP TABLE singer")
        );
    }

    #[test]
    fn verdict_is_the_last_all_caps_word() {
        use CheckVerdict::*;
        assert_eq!(
            parse_verdict("Looks fine.\nTHE QUERY IS CORRECT"),
            Some(Correct)
        );
        assert_eq!(parse_verdict("THE QUERY IS INCORRECT."), Some(Incorrect));
        // both: the later one wins, in either order
        assert_eq!(
            parse_verdict("At first INCORRECT, but on reflection: CORRECT"),
            Some(Correct)
        );
        assert_eq!(
            parse_verdict("I thought CORRECT. THE QUERY IS INCORRECT"),
            Some(Incorrect)
        );
        assert_eq!(parse_verdict("THE QUERY IS NOT CORRECT"), Some(Incorrect));
        // lowercase mentions are not verdicts
        assert_eq!(parse_verdict("the join is correct and complete"), None);
        assert_eq!(parse_verdict(""), None);
        assert_eq!(parse_verdict("INCORRECTLY phrased"), None);
        let j = serde_json::to_string(&Incorrect).unwrap();
        assert_eq!(j, "\"incorrect\"");
    }
}
