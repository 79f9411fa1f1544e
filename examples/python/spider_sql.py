"""The Spider task in plain Python (standard library only): the write prompt, reading SQL out
of a reply, running SQL against a Spider database, and execution match.

Each piece is a port of agl's own (so a Python agent gets the reward agl's built-in agent
would), written from the behaviour documented in agl's sources:

- ``write_messages``, ``extract_sql`` mirror ``crates/agl-spider/src/prompts.rs``
  (``write_messages``, ``extract_sql``); ``agl spider tasks --messages`` prints agl's own
  messages for a task, and ``test_match.py`` checks that these are equal to them;
- ``execute`` mirrors ``crates/agl-spider/src/executor.rs``: an in-memory copy of the database,
  every statement inside ``BEGIN`` … ``ROLLBACK``, transaction control / ``ATTACH`` /
  value-setting ``PRAGMA`` denied, a time limit (default 2 s, as ``agl train --sql-timeout``)
  checked every 1000 SQLite instructions, at most 1,000,000 rows, and the rows of the *last*
  statement that returns columns;
- ``gold_is_ordered`` and ``execution_match`` mirror ``crates/agl-spider/src/eval.rs``: rows as a
  bag, or as a sequence when the gold SQL has a top-level ``ORDER BY``; columns in any order;
  ``1 == 1.0``; other reals compared exactly; ``'1' != 1``; both results empty → match.

Known differences: ``gold_is_ordered`` scans for ``ORDER BY`` outside parentheses, strings and
comments, where agl parses the SQL with ``sqlparser`` (and falls back to a text search when it
does not parse); a query wrapped whole in parentheses counts as ordered there and not here.
``test_match.py`` measures the agreement on Spider's gold queries.
"""

from __future__ import annotations

import sqlite3
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------------------------
# The write prompt (crates/agl-spider/src/prompts.rs, `write_messages`), copied as text.
# ---------------------------------------------------------------------------------------------

DIALECT = "SQLite"

OUTPUT_FORMAT = (
    "Output format: answer with exactly one fenced code block that holds the query, and nothing "
    "else:\n```sql\nSELECT ...\n```"
)

WRITER_SYSTEM = (
    f"You are an agent that answers questions about a {DIALECT} database by writing one "
    f"syntactically correct {DIALECT} query.\n\n"
    "Rules:\n"
    "- Use only the tables and columns listed in the schema below. Never invent a table or a "
    "column, and check which table each column belongs to.\n"
    "- Select only the columns the question asks for.\n"
    "- Write one read-only statement (SELECT, or WITH ... SELECT). Never modify the database: no "
    "INSERT, UPDATE, DELETE, DROP, ALTER or CREATE.\n"
    "- Double-quote identifiers that contain spaces or other special characters.\n\n"
    "Schema:\n{schema}\n\n" + OUTPUT_FORMAT
)

ANSWER_REMINDER = "Answer with one SQLite query in a ```sql block."


def write_messages(schema: str, question: str) -> List[Dict[str, str]]:
    """The write prompt: the system message (rules, ``schema`` as ``agl spider tasks`` renders
    it, output format) and the user message ``Question: …`` plus a one-line reminder."""
    return [
        {"role": "system", "content": WRITER_SYSTEM.replace("{schema}", schema)},
        {"role": "user", "content": f"Question: {question.strip()}\n{ANSWER_REMINDER}"},
    ]


def write_messages_with(template: Any, schema: str, question: str) -> List[Dict[str, str]]:
    """``write_messages`` with the user message rendered from ``template`` (Agent Lightning's
    ``PromptTemplate``, f-string engine, fields ``question`` and ``schema``), as agl's
    ``LlmSqlAgent`` renders its ``prompt_template`` resource (``write_messages_with``)."""
    return [
        {"role": "system", "content": WRITER_SYSTEM.replace("{schema}", schema)},
        {"role": "user", "content": template.format(question=question.strip(), schema=schema)},
    ]


# ---------------------------------------------------------------------------------------------
# extract_sql (prompts.rs)
# ---------------------------------------------------------------------------------------------


def _ascii_lower(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def _fences(text: str) -> List[Tuple[str, str]]:
    """Every ``` block as (lowercase info string, body); an unclosed block runs to the end."""
    out: List[Tuple[str, str]] = []
    rest = text
    while True:
        start = rest.find("```")
        if start < 0:
            return out
        after = rest[start + 3 :]
        nl = after.find("\n")
        info, body = (after, "") if nl < 0 else (after[:nl], after[nl + 1 :])
        close = body.find("```")
        if close >= 0:
            body, rest = body[:close], body[close + 3 :]
        else:
            rest = ""
        out.append((_ascii_lower(info.strip()), body))


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def _first_query_keyword(text: str) -> Optional[int]:
    i, n = 0, len(text)
    while i < n:
        if _is_word(text[i]) and (i == 0 or not _is_word(text[i - 1])):
            end = i
            while end < n and _is_word(text[end]):
                end += 1
            if _ascii_lower(text[i:end]) in ("select", "with"):
                return i
            i = end
        else:
            i += 1
    return None


def extract_sql(reply: str) -> Optional[str]:
    """The SQL of a reply, trimmed: the last ```sql (or ```sqlite) block, else the last fenced
    block of any language, else the text from the first SELECT/WITH word; None when none of
    these holds non-blank text."""
    blocks = _fences(reply)
    for lang, body in reversed(blocks):
        if lang in ("sql", "sqlite") and body.strip():
            return body.strip()
    for _, body in reversed(blocks):
        if body.strip():
            return body.strip()
    start = _first_query_keyword(reply)
    if start is None:
        return None
    return reply[start:].strip() or None


# ---------------------------------------------------------------------------------------------
# The sandboxed executor (executor.rs)
# ---------------------------------------------------------------------------------------------

MAX_RESULT_ROWS = 1_000_000
PROGRESS_OPS = 1_000
READ_ONLY_PRAGMAS_WITH_ARG = {
    "foreign_key_check",
    "foreign_key_list",
    "index_info",
    "index_list",
    "index_xinfo",
    "integrity_check",
    "quick_check",
    "table_info",
    "table_list",
    "table_xinfo",
}


class SqlError(Exception):
    """The SQL failed: SQLite's message, a denied statement, too many rows, or the time limit."""


def _authorizer(action: int, arg1: Optional[str], arg2: Optional[str], _db: Any, _trigger: Any) -> int:
    if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and arg2 is not None:
        if (arg1 or "").lower() not in READ_ONLY_PRAGMAS_WITH_ARG:
            return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _statements(sql: str) -> List[str]:
    """``sql`` split into complete statements (``sqlite3.complete_statement`` decides where
    one ends, so semicolons in strings and comments do not split); a trailing incomplete
    statement is kept (SQLite reports its error)."""
    out, buf = [], ""
    for ch in sql:
        buf += ch
        if ch == ";" and sqlite3.complete_statement(buf):
            out.append(buf)
            buf = ""
    if buf.strip():
        out.append(buf)
    return out


Result = Tuple[int, List[Tuple[Any, ...]]]
"""An execution result: (number of columns, rows)."""

_CACHE = threading.local()


def _memory_copy(db_path: str) -> sqlite3.Connection:
    """A cached in-memory copy of ``db_path`` (opened read-only), one per thread."""
    cache: Dict[str, sqlite3.Connection] = getattr(_CACHE, "conns", None) or {}
    _CACHE.conns = cache
    if db_path not in cache:
        src = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        mem = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        src.backup(mem)
        src.close()
        mem.text_factory = lambda b: b.decode("utf-8", "replace")
        cache[db_path] = mem
    return cache[db_path]


def execute(db_path: str, sql: str, timeout: float = 2.0) -> Result:
    """Runs every statement of ``sql`` on an in-memory copy of ``db_path`` inside a transaction
    that is always rolled back; returns the last statement with columns (0 columns, no rows if
    none had any). Raises SqlError."""
    conn = _memory_copy(db_path)
    deadline = time.monotonic() + timeout
    timed_out = [False]

    def progress() -> int:
        if time.monotonic() >= deadline:
            timed_out[0] = True
            return 1
        return 0

    conn.execute("BEGIN")
    conn.set_progress_handler(progress, PROGRESS_OPS)
    conn.set_authorizer(_authorizer)
    result: Result = (0, [])
    try:
        for stmt in _statements(sql):
            cur = conn.execute(stmt)
            if cur.description is None:
                continue
            rows = cur.fetchmany(MAX_RESULT_ROWS + 1)
            if len(rows) > MAX_RESULT_ROWS:
                raise SqlError(f"result exceeds {MAX_RESULT_ROWS} rows")
            result = (len(cur.description), rows)
    except sqlite3.Warning as e:  # e.g. "You can only execute one statement at a time."
        raise SqlError(str(e)) from None
    except sqlite3.Error as e:
        if timed_out[0]:
            raise SqlError(f"timed out after {timeout:g} s") from None
        raise SqlError(str(e)) from None
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        else:  # the SQL ended the transaction: never reuse this copy
            _CACHE.conns.pop(db_path, None)
    return result


# ---------------------------------------------------------------------------------------------
# Execution match (eval.rs)
# ---------------------------------------------------------------------------------------------

_NAN_BITS = struct.unpack("<Q", struct.pack("<d", float("nan")))[0]
_TWO_POW_63 = 9_223_372_036_854_775_808.0


def _key(v: Any) -> Tuple[int, Any]:
    """A value normalised for equality: NULL, integers (and integral reals in i64 range),
    other reals by their bits (all NaNs one value), text, blobs."""
    if v is None:
        return (0, 0)
    if isinstance(v, int):
        return (1, v)
    if isinstance(v, float):
        if v != v:
            return (2, _NAN_BITS)
        if v.is_integer() and -_TWO_POW_63 <= v < _TWO_POW_63:
            return (1, int(v))
        return (2, struct.unpack("<Q", struct.pack("<d", v))[0])
    if isinstance(v, str):
        return (3, v)
    return (4, bytes(v))


def execution_match(gold: Result, predicted: Result, ordered: bool) -> bool:
    """Whether ``predicted`` equals ``gold`` under Spider's execution accuracy (see the module
    docs): some permutation of the predicted columns makes the rows equal, in sequence when
    ``ordered``, else as a bag."""
    (n, g_rows), (pn, p_rows) = gold, predicted
    if not g_rows and not p_rows:
        return True
    if n != pn or len(g_rows) != len(p_rows):
        return False
    if any(len(r) != n for r in list(g_rows) + list(p_rows)):
        return False
    g = [[_key(r[c]) for r in g_rows] for c in range(n)]
    p = [[_key(r[c]) for r in p_rows] for c in range(n)]
    if ordered:
        return sorted(g) == sorted(p)
    g_bags = [sorted(c) for c in g]
    p_bags = [sorted(c) for c in p]
    candidates = [[j for j in range(n) if p_bags[j] == gb] for gb in g_bags]
    if any(not c for c in candidates):
        return False
    twin_of = [next((k for k in range(j - 1, -1, -1) if p[k] == p[j]), None) for j in range(n)]
    order = sorted(range(n), key=lambda i: len(candidates[i]))
    rows = len(g_rows)

    def project(cols: Sequence[List[Any]], picks: Sequence[int]) -> List[Tuple[Any, ...]]:
        return sorted(tuple(cols[c][r] for c in picks) for r in range(rows))

    assigned: List[int] = []
    used = [False] * n

    def search() -> bool:
        depth = len(assigned)
        if depth == n:
            return True
        for j in candidates[order[depth]]:
            if used[j]:
                continue
            t = twin_of[j]
            if t is not None and not used[t]:
                continue
            used[j] = True
            assigned.append(j)
            if project(g, order[: depth + 1]) == project(p, assigned) and search():
                return True
            assigned.pop()
            used[j] = False
        return False

    return search()


def gold_is_ordered(gold_sql: str) -> bool:
    """Whether ``gold_sql`` has ``ORDER BY`` at the top level: outside parentheses, string
    literals, quoted identifiers and comments."""
    s, n, i, depth = gold_sql, len(gold_sql), 0, 0
    words: List[str] = []
    while i < n:
        c = s[i]
        if c in "'\"`[":
            close = "]" if c == "[" else c
            j = i + 1
            while j < n:
                if s[j] == close:
                    if close != "]" and j + 1 < n and s[j + 1] == close:
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
            words.append("")
        elif s.startswith("--", i):
            j = s.find("\n", i)
            i = n if j < 0 else j + 1
        elif s.startswith("/*", i):
            j = s.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "(":
            depth += 1
            i += 1
            words.append("")
        elif c == ")":
            depth = max(0, depth - 1)
            i += 1
            words.append("")
        elif _is_word(c):
            j = i
            while j < n and _is_word(s[j]):
                j += 1
            if depth == 0:
                words.append(_ascii_lower(s[i:j]))
                if len(words) >= 2 and words[-2:] == ["order", "by"]:
                    return True
            else:
                words.append("")
            i = j
        elif c.isspace():
            i += 1
        else:
            words.append("")
            i += 1
    return False


def reward(db_path: str, gold_sql: str, predicted_sql: Optional[str], timeout: float = 2.0) -> Tuple[float, Optional[str]]:
    """1.0 when ``predicted_sql`` runs and matches ``gold_sql`` by execution, else 0.0; with the
    predicted query's error (or ``"no predicted SQL"``), as ``agl spider score`` reports it."""
    if not predicted_sql:
        return 0.0, "no predicted SQL"
    try:
        pred = execute(db_path, predicted_sql, timeout)
    except SqlError as e:
        return 0.0, str(e)
    try:
        gold = execute(db_path, gold_sql, timeout)
    except SqlError as e:
        return 0.0, f"the gold SQL failed: {e}"
    return (1.0 if execution_match(gold, pred, gold_is_ordered(gold_sql)) else 0.0), None
