//! Task datasets for any agent, as Agent Lightning's `Trainer.fit(train_dataset=…,
//! val_dataset=…)` takes them: a list of tasks, each any JSON value (an object, a string, a
//! number…), handed to the agent unchanged as the rollout's `input`.
//!
//! [`load_dataset`] reads a file in one of two shapes:
//! - **JSON Lines** (`.jsonl`, `.ndjson`, or any file whose first non-blank character is not
//!   `[`): one task per line; blank lines are skipped;
//! - **a JSON array** (`.json`, or a file starting with `[`): the array's elements are the tasks.
//!
//! A UTF-8 byte order mark is ignored. Errors name the file and, for JSON Lines, the line
//! (from 1), and for an array serde's line and column; nothing is partly loaded.
//!
//! Responsible for reading and checking the file; not for what a task means (the agent's) or
//! the order tasks are used in (the loop's).

use std::path::Path;

use serde_json::Value;

use agl_core::json_kind;

use crate::error::TrainError;

/// Reads the tasks of `path` (see the module docs), in file order.
///
/// # Errors
/// [`TrainError::Io`] when the file cannot be read; [`TrainError::Config`] naming the file
/// (and line) when it is not UTF-8, a line or the array is not JSON, a `.json` file is not an
/// array, or there is no task.
pub fn load_dataset(path: &Path) -> Result<Vec<Value>, TrainError> {
    let bytes = std::fs::read(path).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let shown = path.display();
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        TrainError::Config(format!(
            "{shown}: not UTF-8 text (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let array = match ext.as_deref() {
        Some("jsonl" | "ndjson") => false,
        Some("json") => true,
        _ => text.trim_start().starts_with('['),
    };
    let tasks = if array {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => items,
            Ok(other) => {
                return Err(TrainError::Config(format!(
                    "{shown}: expected a JSON array of tasks, found {} (use .jsonl for one task \
                     per line)",
                    json_kind(&other)
                )));
            }
            Err(e) => return Err(TrainError::Config(format!("{shown}: not JSON: {e}"))),
        }
    } else {
        let mut tasks = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let task = serde_json::from_str(line).map_err(|e| {
                TrainError::Config(format!(
                    "{shown}:{}: not JSON: {e} (one task per line)",
                    i + 1
                ))
            })?;
            tasks.push(task);
        }
        tasks
    };
    if tasks.is_empty() {
        return Err(TrainError::Config(format!("{shown}: no tasks")));
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> std::path::PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn jsonl_and_arrays_read_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "t.jsonl",
            b"\xef\xbb\xbf{\"q\": 1}\n\n  \n\"two\"\r\n[3]\n",
        );
        assert_eq!(
            load_dataset(&p).unwrap(),
            vec![json!({"q": 1}), json!("two"), json!([3])]
        );
        let p = write(&dir, "t.json", b" [ {\"q\": 1}, 2 ]");
        assert_eq!(load_dataset(&p).unwrap(), vec![json!({"q": 1}), json!(2)]);
        // no extension: sniffed
        let p = write(&dir, "tasks", b"[1, 2, 3]");
        assert_eq!(load_dataset(&p).unwrap().len(), 3);
        let p = write(&dir, "tasks.txt", b"{\"a\": 1}\n{\"a\": 2}\n");
        assert_eq!(load_dataset(&p).unwrap().len(), 2);
    }

    #[test]
    fn bad_files_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(&dir, "bad.jsonl", b"{\"q\": 1}\n\n{\"q\": 2\n{\"q\": 3}\n");
        let e = load_dataset(&p).unwrap_err().to_string();
        assert!(e.contains("bad.jsonl:3: not JSON"), "{e}");
        let p = write(&dir, "obj.json", b"{\"q\": 1}");
        let e = load_dataset(&p).unwrap_err().to_string();
        assert!(
            e.contains("obj.json") && e.contains("expected a JSON array") && e.contains("object"),
            "{e}"
        );
        let p = write(&dir, "broken.json", b"[1, 2,\n  ]");
        let e = load_dataset(&p).unwrap_err().to_string();
        assert!(
            e.contains("broken.json: not JSON") && e.contains("line 2"),
            "{e}"
        );
        let p = write(&dir, "empty.jsonl", b"\n\n");
        let e = load_dataset(&p).unwrap_err().to_string();
        assert!(e.contains("empty.jsonl: no tasks"), "{e}");
        let p = write(&dir, "latin1.jsonl", b"\"caf\xe9\"\n");
        let e = load_dataset(&p).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("offset 4"), "{e}");
        let missing = dir.path().join("nope.jsonl");
        match load_dataset(&missing) {
            Err(TrainError::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected an Io error, got {other:?}"),
        }
    }
}
