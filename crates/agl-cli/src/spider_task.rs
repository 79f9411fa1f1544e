//! The task lines of `agl spider tasks` read back as the built-in SQL agent's questions, for
//! `agl train --runner sql` (the writer is `cmd::spider`; the format is documented there:
//! `{"id", "db_id", "question", "schema", "gold", "db_path"}`, `id` = `<split>-<index>`).
//!
//! Responsible for that reading and its errors; not for the agent or the dataset.

use agl_spider::Question;
use serde_json::Value;

/// The built-in SQL agent's question for one task: a line of `agl spider tasks` (`id` =
/// `<split>-<index>`, `db_id`, `question`, `gold`; other fields are ignored) or a serialised
/// [`Question`] (`split`, `index`, `db_id`, `question`, `gold_sql`). The error names the first
/// field that is missing or of the wrong type.
pub fn task_question(task: &Value) -> Result<Question, String> {
    if task.get("gold_sql").is_some() {
        return serde_json::from_value(task.clone())
            .map_err(|e| format!("not a Spider question: {e}"));
    }
    let text = |name: &str| -> Result<String, String> {
        match task.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!(
                "field `{name}` must be a string, not {}",
                agl_core::json_kind(other)
            )),
            None => Err(format!(
                "missing field `{name}` (a task of `agl spider tasks` has id, db_id, question, \
                 gold)"
            )),
        }
    };
    let id = text("id")?;
    let (split, index) = id
        .split_once('-')
        .and_then(|(s, i)| Some((crate::args::data::parse_split(s).ok()?, i.parse().ok()?)))
        .ok_or_else(|| format!("`id` {id:?} is not `<train|dev>-<index>`"))?;
    Ok(Question {
        split,
        index,
        db_id: text("db_id")?,
        question: text("question")?,
        gold_sql: text("gold")?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use agl_spider::Split;

    #[test]
    fn task_lines_and_questions_become_the_agents_questions() {
        let line = serde_json::json!({"id": "train-12", "db_id": "concert_singer",
            "question": "How many singers?", "schema": "…", "gold": "SELECT count(*) FROM singer",
            "db_path": "/x"});
        let q = task_question(&line).unwrap();
        assert_eq!((q.split, q.index), (Split::Train, 12));
        assert_eq!(q.gold_sql, "SELECT count(*) FROM singer");
        let back = task_question(&serde_json::to_value(&q).unwrap()).unwrap();
        assert_eq!(back, q);
        let bad = serde_json::json!({"id": "test-1", "db_id": "a", "question": "b", "gold": "c"});
        assert_eq!(
            task_question(&bad).unwrap_err(),
            "`id` \"test-1\" is not `<train|dev>-<index>`"
        );
        let wrong = serde_json::json!({"id": "dev-1", "db_id": 3, "question": "b", "gold": "c"});
        assert_eq!(
            task_question(&wrong).unwrap_err(),
            "field `db_id` must be a string, not a number"
        );
    }
}
