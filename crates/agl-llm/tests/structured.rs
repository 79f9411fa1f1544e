//! Structured outputs on the real model (SmolLM2-135M-Instruct): completions under a JSON
//! schema, a JSON object or a Lark grammar parse; the reported log-probabilities stay the raw
//! model's; `forced` marks the tokens the grammar chose; bad grammars are refused at submit;
//! unconstrained rows in the same batch are unaffected.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use agl_llm::structured::json_schema_with_defaults;
use agl_llm::{
    Completion, Constraint, Engine, EngineConfig, Event, FinishReason, GenerateRequest, Generation,
    LlmError, LoadedModel, SamplingParams, StopReason,
};
use serde_json::{Value, json};
use std::sync::atomic::Ordering::Relaxed;

use common::chat_prompt_with as prompt;

fn person_prompt(lm: &LoadedModel) -> Vec<u32> {
    prompt(
        lm,
        "You answer in JSON.",
        "Describe a person: name, age and favourite colour.",
    )
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colour": {"enum": ["red", "green", "blue"]}
        },
        "required": ["name", "age", "colour"],
        "additionalProperties": false
    })
}

fn generate(engine: &Engine, prompt: Vec<u32>, params: SamplingParams) -> Generation {
    engine
        .generate_blocking(GenerateRequest {
            model: None,
            prompt,
            params,
        })
        .unwrap()
}

/// The completion ended with an end-of-sequence token, as a finished grammar makes it.
fn assert_ends_with_eos(lm: &LoadedModel, c: &Completion) {
    let eos = lm.tokenizer.eos_token_ids();
    assert_eq!(c.finish_reason, FinishReason::Stop, "{c:?}");
    let last = *c.token_ids.last().unwrap();
    assert!(eos.contains(&last), "{c:?}");
    assert_eq!(c.stop_reason, Some(StopReason::Eos(last)));
}

#[test]
fn a_json_schema_group_parses_reports_raw_logprobs_and_marks_forced_tokens() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let prompt = person_prompt(lm);
    let params = SamplingParams {
        temperature: 1.0,
        n: 4,
        seed: Some(7),
        max_tokens: Some(96),
        logprobs: Some(3),
        constraint: Some(Constraint::JsonSchema(person_schema())),
        ..Default::default()
    };
    let g = generate(&engine, prompt.clone(), params);
    assert_eq!(g.completions.len(), 4);
    let mut worst = 0f32;
    let mut forced_inside = 0;
    let mut texts = Vec::new();
    for c in &g.completions {
        eprintln!("{:?}", c.text);
        assert_ends_with_eos(lm, c);
        // (a) It parses and satisfies the schema.
        let v: Value = serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {c:?}"));
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 3, "{v}");
        let name = obj["name"].as_str().unwrap();
        assert!(name.chars().count() <= 20, "{v}");
        let age = obj["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{v}");
        assert!(
            ["red", "green", "blue"].contains(&obj["colour"].as_str().unwrap()),
            "{v}"
        );
        texts.push(c.text.clone());
        // (e) The reported log-probabilities are the raw model's, not the mask's.
        let raw = common::teacher_forced_logprobs(lm, &prompt, &c.token_ids);
        for (j, lp) in c.logprobs.iter().enumerate() {
            worst = worst.max((raw[j] - lp.logprob).abs());
            // Alternatives are raw too: the best of them is at least as likely as the token.
            assert!(lp.top[0].1 >= lp.logprob - 1e-6);
        }
        // (d) The final end-of-sequence token is forced, and so are some tokens before it.
        assert!(c.logprobs.last().unwrap().forced);
        forced_inside += c.logprobs[..c.logprobs.len() - 1]
            .iter()
            .filter(|l| l.forced)
            .count();
        assert!(c.logprobs.iter().any(|l| !l.forced), "{c:?}");
    }
    eprintln!("largest |reported - recomputed| log-probability: {worst:e}");
    assert!(worst < 1e-3, "log-probabilities differ by {worst}");
    assert!(forced_inside > 0, "no forced token before the end");
    // Temperature 1 with four streams: not four copies of one answer.
    texts.sort();
    texts.dedup();
    assert!(texts.len() > 1, "{texts:?}");

    // (d) Without a constraint nothing is forced.
    let free = generate(
        &engine,
        prompt,
        SamplingParams {
            seed: Some(7),
            max_tokens: Some(16),
            logprobs: Some(0),
            ..Default::default()
        },
    );
    assert!(free.completions[0].logprobs.iter().all(|l| !l.forced));
    engine.shutdown();
}

#[test]
fn a_json_object_and_a_lark_tool_call_parse() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    // (b) Any JSON object.
    let g = generate(
        &engine,
        prompt(
            lm,
            "You answer in JSON.",
            "Give a JSON object with the key \"answer\" and the value 42.",
        ),
        SamplingParams {
            temperature: 0.0,
            max_tokens: Some(64),
            constraint: Some(Constraint::JsonObject),
            ..Default::default()
        },
    );
    let c = &g.completions[0];
    eprintln!("{:?}", c.text);
    assert_ends_with_eos(lm, c);
    let v: Value = serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {c:?}"));
    assert!(v.is_object(), "{v}");

    // (c) A hermes tool call whose arguments follow the tool's parameters.
    let parameters = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": false
    });
    let grammar = format!(
        "start: \"<tool_call>\\n{{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" args \"}}\\n</tool_call>\"\nargs: %json {}\n",
        json_schema_with_defaults(&parameters)
    );
    let g = generate(
        &engine,
        prompt(
            lm,
            "You call tools.",
            "What is the weather in Paris? Call get_weather.",
        ),
        SamplingParams {
            temperature: 1.0,
            seed: Some(3),
            n: 2,
            max_tokens: Some(96),
            constraint: Some(Constraint::Lark(grammar)),
            ..Default::default()
        },
    );
    for c in &g.completions {
        eprintln!("{:?}", c.text);
        assert_ends_with_eos(lm, c);
        let body = c
            .text
            .strip_prefix("<tool_call>\n")
            .and_then(|t| t.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("{:?}", c.text));
        let call: Value = serde_json::from_str(body).unwrap();
        assert_eq!(call["name"], "get_weather");
        let args = call["arguments"].as_object().unwrap();
        assert_eq!(args.len(), 1);
        assert!(args["city"].as_str().unwrap().chars().count() <= 30);
    }
    engine.shutdown();
}

#[test]
fn bad_constraints_are_refused_at_submit_and_the_engine_keeps_serving() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let prompt = person_prompt(lm);
    for bad in [
        Constraint::JsonSchema(json!({"type": 5})),
        Constraint::Lark("start: \"a\" (".into()),
        Constraint::Lark("start: undefined_rule".into()),
    ] {
        let err = engine
            .submit(GenerateRequest {
                model: None,
                prompt: prompt.clone(),
                params: SamplingParams {
                    constraint: Some(bad.clone()),
                    ..Default::default()
                },
            })
            .unwrap_err();
        eprintln!("{bad:?}: {err}");
        match &err {
            LlmError::InvalidRequest { param, message } => {
                assert_eq!(param, "constraint");
                assert!(!message.is_empty());
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let g = generate(
        &engine,
        prompt,
        SamplingParams {
            max_tokens: Some(4),
            seed: Some(1),
            constraint: Some(Constraint::JsonObject),
            ..Default::default()
        },
    );
    // max_tokens still ends a constrained row (the document is then incomplete).
    let c = &g.completions[0];
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(c.token_ids.len(), 4);
    assert!(c.text.starts_with('{'), "{:?}", c.text);
    engine.shutdown();
}

#[test]
fn an_unconstrained_request_batched_with_a_constrained_one_is_unchanged() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let free_prompt = prompt(lm, "You are helpful.", "Name three rivers in Europe.");
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(24),
        ..Default::default()
    };
    let alone = generate(&engine, free_prompt.clone(), greedy.clone()).completions[0]
        .token_ids
        .clone();
    let constrained = engine
        .submit(GenerateRequest {
            model: None,
            prompt: person_prompt(lm),
            params: SamplingParams {
                n: 4,
                seed: Some(11),
                max_tokens: Some(96),
                constraint: Some(Constraint::JsonSchema(person_schema())),
                ..Default::default()
            },
        })
        .unwrap();
    let mut free = engine
        .submit(GenerateRequest {
            model: None,
            prompt: free_prompt,
            params: greedy,
        })
        .unwrap();
    // From its third token on, the last finished step included the free row: rows beyond it
    // there are the constrained group's, decoding in the same batch.
    let mut tokens = Vec::new();
    let mut widest_step = 0;
    while let Some(ev) = free.events.blocking_recv() {
        match ev {
            Event::Token { logprob, .. } => {
                tokens.push(logprob.token_id);
                if tokens.len() >= 3 {
                    widest_step = widest_step.max(engine.stats().last_batch_rows.load(Relaxed));
                }
            }
            Event::Finished { .. } => break,
            Event::Error(e) => panic!("{e}"),
        }
    }
    assert!(widest_step >= 2, "the two requests never shared a step");
    assert_eq!(tokens, alone);
    let constrained = constrained.collect_blocking().unwrap();
    for c in &constrained.completions {
        assert_ends_with_eos(lm, c);
        serde_json::from_str::<Value>(&c.text).unwrap();
    }
    engine.shutdown();
}

#[test]
fn oversized_and_explosive_grammars_are_cut_off_by_the_limits() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    // Far past the grammar-size limit: refused at submit, the limit named.
    let huge: Vec<String> = (0..300_000).map(|i| format!("value number {i}")).collect();
    let started = std::time::Instant::now();
    let err = engine
        .compile_constraint(&Constraint::JsonSchema(json!({"enum": huge})))
        .unwrap_err();
    eprintln!(
        "huge enum: {:?} after {:?}",
        err.to_string(),
        started.elapsed()
    );
    assert!(
        matches!(&err, LlmError::InvalidRequest { param, .. } if param == "constraint"),
        "{err:?}"
    );
    // A lexer whose automaton explodes (2^40 states): either refused at submit or, if it
    // compiles, each mask stays within the per-step fuel; the request ends either way.
    let started = std::time::Instant::now();
    let explosive = Constraint::Lark("start: /(a|b)*a(a|b){40}/".into());
    match engine.submit(GenerateRequest {
        model: None,
        prompt: person_prompt(lm),
        params: SamplingParams {
            max_tokens: Some(16),
            seed: Some(2),
            constraint: Some(explosive),
            ..Default::default()
        },
    }) {
        Err(e) => {
            eprintln!("explosive lexer refused: {e}");
            assert!(matches!(&e, LlmError::InvalidRequest { param, .. } if param == "constraint"));
        }
        Ok(stream) => match stream.collect_blocking() {
            Ok(g) => {
                let text = &g.completions[0].text;
                eprintln!("explosive lexer ran: {text:?}");
                assert!(text.chars().all(|c| c == 'a' || c == 'b'), "{text:?}");
            }
            Err(e) => eprintln!("explosive lexer ended the request: {e}"),
        },
    }
    eprintln!("explosive lexer: {:?}", started.elapsed());
    // The engine still serves.
    let g = generate(
        &engine,
        person_prompt(lm),
        SamplingParams {
            max_tokens: Some(4),
            ..Default::default()
        },
    );
    assert_eq!(g.completions[0].token_ids.len(), 4);
    engine.shutdown();
}

#[test]
fn stop_strings_and_ignore_eos_keep_working_under_a_constraint() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let eos = lm.tokenizer.eos_token_ids();
    // A stop string ends the row before the document is complete; the text stops before it.
    let g = generate(
        &engine,
        person_prompt(lm),
        SamplingParams {
            seed: Some(4),
            max_tokens: Some(96),
            stop: vec!["\"age\"".into()],
            constraint: Some(Constraint::JsonSchema(person_schema())),
            ..Default::default()
        },
    );
    let c = &g.completions[0];
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(c.stop_reason, Some(StopReason::Text("\"age\"".into())));
    assert!(
        c.text.starts_with("{\"name\": \"") && c.text.ends_with(", "),
        "{c:?}"
    );
    // With ignore_eos a complete grammar keeps the row on forced end-of-sequence tokens until
    // max_tokens.
    let g = generate(
        &engine,
        person_prompt(lm),
        SamplingParams {
            max_tokens: Some(6),
            ignore_eos: true,
            logprobs: Some(0),
            constraint: Some(Constraint::Lark("start: \"{}\"".into())),
            ..Default::default()
        },
    );
    let c = &g.completions[0];
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(c.token_ids.len(), 6);
    assert_eq!(c.text, "{}");
    let tail: Vec<_> = c
        .logprobs
        .iter()
        .skip_while(|l| !eos.contains(&l.token_id))
        .collect();
    assert!(!tail.is_empty());
    assert!(
        tail.iter().all(|l| l.forced && eos.contains(&l.token_id)),
        "{c:?}"
    );
    engine.shutdown();
}
