//! APO's beam search with a scripted optimiser and a scripted evaluator: the exact sequence of
//! parents, children and scores for a seed, a round whose re-scored leader is worse than the
//! best prompt so far (the best is kept), counted skips, and the best prompt kept through an
//! interruption.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;

use agl_core::RolloutMode;
use agl_train::CancellationToken;
use agl_train::apo::{
    Apo, ApoConfig, ApoObserver, ApoReport, Candidate, ChatTurn, Completion, Experiment,
    OptimizerPrompts, PromptEvaluator, Silent, TextModel, ViolationNote,
};
use serde_json::{Value, json};

/// Every rollout of a template scores the number after `batch=` on a validation batch or a
/// training batch, and after `full=` on the whole validation set. Records each call.
struct Scripted {
    val_len: usize,
    calls: Mutex<Vec<(String, RolloutMode, usize)>>,
    stop_after: Option<(usize, CancellationToken)>,
}

fn number_after(template: &str, key: &str) -> f64 {
    let at = template.find(key).expect(key) + key.len();
    template[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[async_trait::async_trait]
impl PromptEvaluator for Scripted {
    async fn evaluate(
        &self,
        candidate: Candidate<'_>,
        tasks: &[Value],
        mode: RolloutMode,
    ) -> Result<Vec<Experiment>, agl_train::TrainError> {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push((candidate.version.to_string(), mode, tasks.len()));
            calls.len()
        };
        if let Some((k, stop)) = &self.stop_after
            && n >= *k
        {
            stop.cancel();
            std::future::pending::<()>().await;
        }
        let full = mode == RolloutMode::Val && tasks.len() == self.val_len;
        let reward = number_after(candidate.template, if full { "full=" } else { "batch=" });
        Ok(tasks
            .iter()
            .map(|t| Experiment {
                status: "succeeded".into(),
                reward: Some(reward),
                violations: if candidate.version.ends_with("-v0") {
                    vec![ViolationNote {
                        policy: "sql_safety".into(),
                        severity: "critical".into(),
                        reason: "DROP TABLE".into(),
                        blocked: true,
                    }]
                } else {
                    Vec::new()
                },
                messages: vec![
                    json!({"role": "user", "content": format!("task {}", t["id"])}),
                    json!({"role": "assistant", "content": "SELECT 1"}),
                ],
            })
            .collect())
    }
}

/// Answers from a queue, in call order; records what it was asked.
struct Optimizer {
    answers: Mutex<Vec<Result<String, String>>>,
    asked: Mutex<Vec<(String, Vec<ChatTurn>)>>,
}

#[async_trait::async_trait]
impl TextModel for Optimizer {
    async fn complete(
        &self,
        model: &str,
        messages: &[ChatTurn],
        _temperature: f64,
        _max_tokens: u32,
    ) -> Result<Completion, String> {
        self.asked
            .lock()
            .unwrap()
            .push((model.to_string(), messages.to_vec()));
        let answer = self.answers.lock().unwrap().remove(0)?;
        Ok(Completion {
            text: answer,
            prompt_tokens: 100,
            completion_tokens: 10,
        })
    }
}

fn critique() -> Result<String, String> {
    Ok("- say which table to use\n- ask for one query".into())
}

fn edit(t: &str) -> Result<String, String> {
    Ok(format!("Here it is:\n<prompt>{t}</prompt>"))
}

fn tasks(n: usize, prefix: &str) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"id": format!("{prefix}{i}")}))
        .collect()
}

fn config() -> ApoConfig {
    ApoConfig {
        beam_width: 2,
        branch_factor: 2,
        beam_rounds: 2,
        gradient_batch_size: 2,
        val_batch_size: 2,
        gradient_model: "critic".into(),
        edit_model: "editor".into(),
        seed: 7,
        ..ApoConfig::default()
    }
}

fn script() -> Vec<Result<String, String>> {
    vec![
        // Round 1, parent v0 (twice: the beam holds one).
        critique(),
        edit("Q: {question} batch=0.875 full=0.25"), // v1: wins the batch, loses the full set
        Err("HTTP 503: overloaded".into()),          // critique failed: skipped
        critique(),
        edit("Q: {question} {hint} batch=1.0 full=1.0"), // placeholders differ: skipped
        critique(),
        edit("Q: {question} batch=0.625 full=0.75"), // v2
        // Round 2: four children of the beam's two members.
        critique(),
        edit("Q: {question} batch=0.9375 full=0.875"), // v3
        Ok("   ...   ".into()),                        // critique not usable: skipped
        critique(),
        edit("no placeholder here batch=0.99 full=0.99"), // placeholders differ: skipped
        critique(),
        edit("```\nQ: {question} batch=0.125 full=0.125\n```"), // v4 (fence removed)
    ]
}

/// The search of these tests: [`config`], versions `run-v<N>`.
fn search<'a>(
    seed_template: &str,
    train: &'a [Value],
    val: &'a [Value],
    evaluator: &'a Scripted,
    optimizer: &'a Optimizer,
    prompts: &'a OptimizerPrompts,
    stop: CancellationToken,
) -> Apo<'a> {
    Apo {
        config: config(),
        version_prefix: "run".into(),
        seed_template: seed_template.into(),
        train,
        val,
        evaluator,
        optimizer,
        prompts,
        stop,
    }
}

struct Rounds(Vec<(usize, String, Option<f64>)>);
impl ApoObserver for Rounds {
    fn round_finished(&mut self, r: &ApoReport) {
        self.0.push((r.rounds.len(), r.best.clone(), r.best_score));
    }
}

#[tokio::test]
async fn the_beam_search_follows_agent_lightnings_steps_and_keeps_the_best() {
    let train = tasks(4, "t");
    let val = tasks(6, "v");
    let evaluator = Scripted {
        val_len: val.len(),
        calls: Mutex::new(Vec::new()),
        stop_after: None,
    };
    let optimizer = Optimizer {
        answers: Mutex::new(script()),
        asked: Mutex::new(Vec::new()),
    };
    let prompts = OptimizerPrompts::builtin().unwrap();
    let apo = search(
        "Q: {question} batch=0.5 full=0.5",
        &train,
        &val,
        &evaluator,
        &optimizer,
        &prompts,
        CancellationToken::new(),
    );
    let mut rounds = Rounds(Vec::new());
    let report = apo.run(&mut rounds).await.unwrap();

    // Round 1: the seed is both parents; two of its four children survive.
    let r1 = &report.rounds[0];
    assert_eq!(r1.parents, ["run-v0", "run-v0"]);
    assert_eq!(r1.children, ["run-v1", "run-v2"]);
    assert_eq!(r1.beam, ["run-v1", "run-v2"]);
    // The leader v1 scores 0.25 on the whole set, below the seed's 0.5: the seed stays best.
    assert_eq!(r1.leader_score, 0.25);
    assert_eq!((r1.best.as_str(), r1.best_score), ("run-v0", Some(0.5)));
    assert_eq!(r1.skips.critique_failed, 1);
    assert_eq!(r1.skips.placeholders_differ, 1);
    // Round 2: both beam members are parents (in the seeded order), two children made.
    let r2 = &report.rounds[1];
    let mut parents = r2.parents.clone();
    parents.sort();
    assert_eq!(parents, ["run-v1", "run-v2"]);
    assert_eq!(r2.children, ["run-v3", "run-v4"]);
    assert_eq!(r2.beam, ["run-v3", "run-v1"]);
    assert_eq!(r2.leader_score, 0.875);
    assert_eq!((r2.best.as_str(), r2.best_score), ("run-v3", Some(0.875)));
    assert_eq!(r2.skips.critique_unusable, 1);
    assert_eq!(r2.skips.placeholders_differ, 1);
    assert_eq!(report.skips.total(), 4);
    // Each skip is kept with what the optimiser said: the failed critique has neither text, the
    // refused edit keeps its critique and answer.
    let skipped: Vec<(usize, Option<&str>, Option<&str>)> = report
        .skipped
        .iter()
        .map(|s| (s.round, s.critique.as_deref(), s.edit.as_deref()))
        .collect();
    assert_eq!(skipped.len(), 4);
    assert_eq!((skipped[0].0, skipped[0].1, skipped[0].2), (1, None, None));
    assert!(report.skipped[0].reason.contains("gave no answer"));
    let refused = report
        .skipped
        .iter()
        .find(|s| s.reason.contains("placeholders"))
        .unwrap();
    assert!(refused.critique.is_some());
    assert!(
        refused
            .edit
            .as_deref()
            .is_some_and(|e| e.contains("{question} {hint}"))
    );
    assert_eq!(refused.parent, "run-v0");
    assert_eq!(
        (report.best.as_str(), report.best_score),
        ("run-v3", Some(0.875))
    );
    assert_eq!(
        report.best_candidate().template,
        "Q: {question} batch=0.9375 full=0.875"
    );
    assert!(!report.interrupted);

    // Every candidate's lineage and scores.
    let lineage: Vec<(&str, Option<&str>, usize)> = report
        .candidates
        .iter()
        .map(|c| (c.version.as_str(), c.parent.as_deref(), c.round))
        .collect();
    assert_eq!(lineage[0], ("run-v0", None, 0));
    assert_eq!(lineage[1], ("run-v1", Some("run-v0"), 1));
    assert_eq!(lineage[2], ("run-v2", Some("run-v0"), 1));
    assert_eq!(lineage[3].2, 2);
    let batch = |v: usize| -> Vec<(usize, f64)> {
        report.candidates[v]
            .val_batch
            .iter()
            .map(|s| (s.round, s.score))
            .collect()
    };
    assert_eq!(batch(0), [(1, 0.5)]); // the seed left the beam after round 1
    assert_eq!(batch(1), [(1, 0.875), (2, 0.875)]);
    assert_eq!(batch(2), [(1, 0.625), (2, 0.625)]);
    assert_eq!(batch(3), [(2, 0.9375)]);
    assert_eq!(batch(4), [(2, 0.125)]);
    assert_eq!(report.candidates[0].val_full[0].score, 0.5);
    assert_eq!(report.candidates[0].val_full[0].violating, 6);
    assert_eq!(report.candidates[1].val_full[0].score, 0.25);
    assert_eq!(report.candidates[3].val_full[0].score, 0.875);
    // Children made: critique and edit tokens; the round's tokens include the skipped ones.
    assert_eq!(report.candidates[1].optimizer_tokens.prompt, 200);
    assert_eq!(r1.optimizer_tokens.prompt, 100 * 6);
    // The run's tokens: every answered call, skipped children's too (6 + 7 calls).
    assert_eq!(report.optimizer_tokens.prompt, 100 * 13);

    // The evaluations, in order: the seed on the whole set, then per child its parent on a
    // training batch, then the beam and children on one validation batch, then the leader.
    let calls = evaluator.calls.lock().unwrap().clone();
    let seen: Vec<(&str, RolloutMode, usize)> =
        calls.iter().map(|(v, m, n)| (v.as_str(), *m, *n)).collect();
    use RolloutMode::{Train, Val};
    assert_eq!(
        &seen[..9],
        [
            ("run-v0", Val, 6),
            ("run-v0", Train, 2),
            ("run-v0", Train, 2),
            ("run-v0", Train, 2),
            ("run-v0", Train, 2),
            ("run-v0", Val, 2),
            ("run-v1", Val, 2),
            ("run-v2", Val, 2),
            ("run-v1", Val, 6),
        ]
    );
    assert_eq!(seen.len(), 9 + 4 + 4 + 1);
    // The observer saw the seed's score and each round's best.
    assert_eq!(
        rounds.0,
        [
            (0, "run-v0".to_string(), Some(0.5)),
            (1, "run-v0".to_string(), Some(0.5)),
            (2, "run-v3".to_string(), Some(0.875)),
        ]
    );

    // The critic read the template, the rollouts and their violations; the editor the
    // critique and the placeholders; each under its own model name.
    let asked = optimizer.asked.lock().unwrap().clone();
    assert_eq!(asked[0].0, "critic");
    let critic_text = &asked[0].1.last().unwrap().content;
    assert!(critic_text.contains("Q: {question} batch=0.5 full=0.5"));
    assert!(critic_text.contains("policy `sql_safety`, severity critical, blocked: DROP TABLE"));
    assert!(critic_text.contains("[assistant] SELECT 1"));
    assert_eq!(asked[1].0, "editor");
    let editor_text = &asked[1].1.last().unwrap().content;
    assert!(editor_text.contains("say which table to use"));
    assert!(editor_text.contains("{question}"));

    // The same seed gives the same search.
    let again = Scripted {
        val_len: val.len(),
        calls: Mutex::new(Vec::new()),
        stop_after: None,
    };
    let optimizer2 = Optimizer {
        answers: Mutex::new(script()),
        asked: Mutex::new(Vec::new()),
    };
    let apo2 = Apo {
        evaluator: &again,
        optimizer: &optimizer2,
        ..apo
    };
    let report2 = apo2.run(&mut Silent).await.unwrap();
    type Shape = Vec<(Vec<String>, Vec<String>, Vec<String>, f64)>;
    let shape = |r: &ApoReport| -> Shape {
        r.rounds
            .iter()
            .map(|r| {
                (
                    r.parents.clone(),
                    r.children.clone(),
                    r.beam.clone(),
                    r.leader_score,
                )
            })
            .collect()
    };
    assert_eq!(shape(&report2), shape(&report));
    assert_eq!(*again.calls.lock().unwrap(), calls);
}

#[tokio::test]
async fn an_interrupted_search_reports_the_best_prompt_so_far() {
    let train = tasks(4, "t");
    let val = tasks(6, "v");
    let stop = CancellationToken::new();
    // Stop during round 1's selection (the 7th evaluation).
    let evaluator = Scripted {
        val_len: val.len(),
        calls: Mutex::new(Vec::new()),
        stop_after: Some((7, stop.clone())),
    };
    let optimizer = Optimizer {
        answers: Mutex::new(script()),
        asked: Mutex::new(Vec::new()),
    };
    let prompts = OptimizerPrompts::builtin().unwrap();
    let apo = search(
        "Q: {question} batch=0.5 full=0.5",
        &train,
        &val,
        &evaluator,
        &optimizer,
        &prompts,
        stop,
    );
    let report = apo.run(&mut Silent).await.unwrap();
    assert!(report.interrupted);
    assert!(report.rounds.is_empty());
    assert_eq!(
        (report.best.as_str(), report.best_score),
        ("run-v0", Some(0.5))
    );
    assert_eq!(report.candidates.len(), 3);
}

#[tokio::test]
async fn bad_settings_and_templates_are_refused_before_anything_runs() {
    let train = tasks(2, "t");
    let val = tasks(2, "v");
    let evaluator = Scripted {
        val_len: 2,
        calls: Mutex::new(Vec::new()),
        stop_after: None,
    };
    let optimizer = Optimizer {
        answers: Mutex::new(Vec::new()),
        asked: Mutex::new(Vec::new()),
    };
    let prompts = OptimizerPrompts::builtin().unwrap();
    let base = search(
        "Q: {question!r}",
        &train,
        &val,
        &evaluator,
        &optimizer,
        &prompts,
        CancellationToken::new(),
    );
    let e = base.run(&mut Silent).await.unwrap_err().to_string();
    assert!(
        e.contains("seed template") && e.contains("conversion"),
        "{e}"
    );
    let zero = Apo {
        config: ApoConfig {
            beam_width: 0,
            ..config()
        },
        seed_template: "Q: {question}".into(),
        ..base
    };
    let e = zero.run(&mut Silent).await.unwrap_err().to_string();
    assert!(e.contains("beam width"), "{e}");
    assert!(evaluator.calls.lock().unwrap().is_empty());
}
