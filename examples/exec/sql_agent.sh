#!/usr/bin/env bash
# A Spider SQL agent in shell (curl + jq), for `agl runner --exec` and `agl train --runner exec:…`.
#
# Input: one task on stdin, a line of `agl spider tasks` ({"id", "db_id", "question", "schema",
# "gold", "db_path"}, with "messages" when written with --messages).
# Environment (set by agl's exec runner): OPENAI_BASE_URL (or OPENAI_API_BASE) — the attempt's
# gateway route —, OPENAI_MODEL, OPENAI_API_KEY, and AGL_RESOURCES (JSON; the sampling parameters
# of the `main_llm` resource are used when present). AGL (optional): the agl binary that scores
# the answer (default: `agl` on PATH).
# Output: diagnostics on stderr; the last stdout line is {"reward": x}.
#
# What it does: one chat completion with the task's "messages" (agl's built-in agent's write
# prompt) or, without them, a short prompt of its own from "schema" and "question"; the SQL is
# the body of the last ```sql block of the reply (else of the last ``` block, else the text from
# the first SELECT/WITH), close to agl's extract_sql but reading fences at line starts only; the
# reward is `agl spider score`'s verdict on it: 1 when its result matches the gold query's by
# Spider's execution match (agl-spider's executor and evaluator), else 0.
#
# Why curl + jq: both are Debian packages (`apt-get install curl jq`); jq builds the request and
# reads the answer, so no JSON is assembled by string concatenation. A failed model call exits
# non-zero without a reward line (the attempt fails and agl may retry it).
set -euo pipefail

AGL="${AGL:-agl}"
BASE_URL="${OPENAI_BASE_URL:-${OPENAI_API_BASE:-}}"
: "${BASE_URL:?OPENAI_BASE_URL is not set}"
: "${OPENAI_MODEL:?OPENAI_MODEL is not set}"

task="$(cat)"
resources="${AGL_RESOURCES:-{\}}"
# sampling_parameters of main_llm (or of the first llm/proxy_llm resource), defaults otherwise.
sampling="$(jq -c '
    (if (.resources? | type) == "object" then .resources else . end) as $r
    | ($r.main_llm // ([$r[]? | select(type == "object" and (.resource_type == "llm" or .resource_type == "proxy_llm"))][0]) // {})
    | .sampling_parameters // {}
    | {temperature: (.temperature // 0), max_tokens: (.max_tokens // 256)}' <<<"$resources" 2>/dev/null \
    || echo '{"temperature":0,"max_tokens":256}')"

request="$(jq -c --arg model "$OPENAI_MODEL" --argjson sampling "$sampling" '
    {model: $model,
     messages: (.messages // [
        {role: "system", content: ("Write one SQLite query that answers the question. Schema:\n" + .schema
            + "\nAnswer with the query in a ```sql block.")},
        {role: "user", content: ("Question: " + .question)}])}
    + $sampling' <<<"$task")"

response="$(curl -sS --fail-with-body --max-time 600 \
    -H "Content-Type: application/json" \
    -H "Authorization: Bearer ${OPENAI_API_KEY:-dummy}" \
    -d "$request" "${BASE_URL%/}/chat/completions")" || {
    echo "sql_agent.sh: the model call failed: $response" >&2
    exit 1
}
reply="$(jq -r '.choices[0].message.content // ""' <<<"$response")"

# The SQL of the reply (see the header).
sql="$(printf '%s\n' "$reply" | awk '
    /^[ \t]*```/ {
        if (!inb) { inb = 1; lang = tolower($0); gsub(/[ \t`]/, "", lang); body = ""; next }
        inb = 0; n++; bodies[n] = body; langs[n] = lang; next
    }
    inb { body = body $0 "\n"; next }
    { text = text $0 "\n" }
    END {
        if (inb) { n++; bodies[n] = body; langs[n] = lang }
        for (i = n; i >= 1; i--) if ((langs[i] == "sql" || langs[i] == "sqlite") && bodies[i] ~ /[^ \t\n]/) { printf "%s", bodies[i]; exit }
        for (i = n; i >= 1; i--) if (bodies[i] ~ /[^ \t\n]/) { printf "%s", bodies[i]; exit }
        if (match(text, /(^|[^A-Za-z0-9_])([Ss][Ee][Ll][Ee][Cc][Tt]|[Ww][Ii][Tt][Hh])([^A-Za-z0-9_]|$)/)) {
            s = substr(text, RSTART); sub(/^[^A-Za-z]/, "", s); printf "%s", s
        }
    }')"

scored="$(jq -c --arg sql "$sql" '{id, db_id, gold, predicted: (if ($sql | test("\\S")) then $sql else null end)}' <<<"$task" \
    | "$AGL" spider score 2>/dev/null)"
echo "sql_agent.sh: $scored" >&2
jq -c '{reward: (if .match then 1.0 else 0.0 end)}' <<<"$scored"
