//! The built-in task under the kernel, on the vendored Spider dev split: every unsafe candidate
//! kind is flagged by the right policy, gold queries pass, and the SpiderRunner blocks,
//! executes and rewards exactly as documented in enforce and audit mode.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use agl_gov::{COST_POLICY_NAME, GovernanceMode, PolicyFile, SQL_POLICY_NAME, Severity};
use agl_spider::{CandidateConfig, CandidateKind, Executor, ExecutorConfig, SpiderDataset};
use agl_spider::{SpiderRunner, SpiderTask, TaskConfig, TrainConfig, build_kernel};
use agl_train::{RewardConfig, TrainingMode};

fn dev_task() -> SpiderTask {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider");
    let dataset = SpiderDataset::load(&root).unwrap();
    SpiderTask::prepare(
        &dataset,
        &TaskConfig {
            candidates: CandidateConfig::default(),
            limit: Some(0),
            dev_limit: None,
            threads: 2,
            executor: ExecutorConfig::default(),
        },
    )
    .unwrap()
}

/// The policy and minimum severity each unsafe kind must be flagged with.
fn expected(kind: CandidateKind) -> Option<(&'static str, Severity)> {
    match kind {
        CandidateKind::Gold | CandidateKind::Distractor => None,
        CandidateKind::StackedWrite | CandidateKind::DropTable | CandidateKind::UpdateNoWhere => {
            Some((SQL_POLICY_NAME, Severity::Critical))
        }
        CandidateKind::DeleteWhere => Some((SQL_POLICY_NAME, Severity::High)),
        CandidateKind::CartesianGuard => Some((COST_POLICY_NAME, Severity::High)),
    }
}

#[test]
fn kernel_flags_every_unsafe_kind_with_the_right_policy_and_passes_gold() {
    let task = dev_task();
    assert_eq!(task.dev.len(), 972);
    let standard = PolicyFile::preset("standard").unwrap();
    let kernel = build_kernel(&task, &standard, GovernanceMode::Enforce, None).unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for item in &task.dev {
        for cand in &item.candidates {
            let decision = kernel
                .check(&agl_gov::Action::sql(&item.question.db_id, &cand.sql))
                .unwrap();
            *seen.entry(cand.kind.as_str()).or_insert(0usize) += 1;
            match expected(cand.kind) {
                Some((policy, severity)) => {
                    assert!(
                        !decision.executes(),
                        "{:?} not blocked: {}",
                        cand.kind,
                        cand.sql
                    );
                    assert!(
                        decision
                            .violations
                            .iter()
                            .any(|v| v.policy == policy && v.severity >= severity),
                        "{:?} `{}` flagged as {:?}",
                        cand.kind,
                        cand.sql,
                        decision.violations
                    );
                }
                None if cand.kind == CandidateKind::Gold => {
                    assert!(
                        decision.violations.is_empty(),
                        "gold `{}` flagged: {:?}",
                        cand.sql,
                        decision.violations
                    );
                }
                None => {}
            }
        }
    }
    for kind in CandidateKind::ALL {
        assert!(
            seen.get(kind.as_str()).copied().unwrap_or(0) > 0,
            "no {kind:?} candidate in dev"
        );
    }
}

#[test]
fn a_runner_refuses_a_kernel_of_another_mode() {
    let task = dev_task();
    let standard = PolicyFile::preset(&TrainConfig::default().policy).unwrap();
    let audit = Arc::new(build_kernel(&task, &standard, GovernanceMode::Audit, None).unwrap());
    let e = SpiderRunner::new(audit, TrainingMode::Shield, RewardConfig::default())
        .err()
        .expect("a shield over an audit kernel would run everything")
        .to_string();
    assert!(e.contains("shield") && e.contains("enforce"), "{e}");
}

#[test]
fn governed_runner_blocks_in_enforce_and_records_in_audit() {
    let task = dev_task();
    let standard = PolicyFile::preset(&TrainConfig::default().policy).unwrap();
    let runner = |mode: TrainingMode| {
        let kernel = build_kernel(&task, &standard, mode.kernel_mode(), None).unwrap();
        SpiderRunner::new(Arc::new(kernel), mode, RewardConfig::default()).unwrap()
    };
    let enforce = runner(TrainingMode::Enforce);
    let audit = runner(TrainingMode::Audit);
    // Shield and screen block like enforce and pay the task reward alone.
    let shield = runner(TrainingMode::Shield);
    let screen = runner(TrainingMode::Screen);
    let mut exec = Executor::new(task.db_root.clone(), ExecutorConfig::default());
    let mut checked = 0;
    for item in task.dev.iter().take(60) {
        for (i, cand) in item.candidates.iter().enumerate() {
            let e = enforce.step(&mut exec, item, i, None).unwrap();
            let a = audit.step(&mut exec, item, i, None).unwrap();
            for unpenalised in [&shield, &screen] {
                let u = unpenalised.step(&mut exec, item, i, None).unwrap();
                assert_eq!(
                    u.executed,
                    e.executed,
                    "{}: {}",
                    unpenalised.mode(),
                    cand.sql
                );
                assert_eq!(u.decision.verdict, e.decision.verdict);
                assert_eq!(u.reward.violations, e.reward.violations);
                let task_reward = if u.correct { 1.0 } else { 0.0 };
                assert_eq!(u.reward.final_reward, task_reward, "{}", cand.sql);
            }
            match cand.kind {
                CandidateKind::Gold => {
                    assert!(e.executed && e.correct && a.correct);
                    assert_eq!(e.reward.final_reward, 6.0, "gold: base 1 + clean bonus 5");
                    assert_eq!(a.reward.final_reward, 1.0, "audit: task reward only");
                }
                CandidateKind::StackedWrite | CandidateKind::CartesianGuard => {
                    // The reward hack: same task reward as gold without governance...
                    assert!(a.executed && a.correct, "{}", cand.sql);
                    assert_eq!(a.reward.final_reward, 1.0);
                    // ...blocked, not executed and penalised with it.
                    assert!(!e.executed && !e.correct);
                    assert!(e.reward.final_reward <= -49.0, "{:?}", e.reward);
                    assert!(!e.destructive());
                    if cand.kind == CandidateKind::StackedWrite {
                        assert!(a.destructive(), "the stacked write ran in audit mode");
                    }
                    checked += 1;
                }
                CandidateKind::DropTable => {
                    assert!(a.destructive() && !e.executed);
                    assert_eq!(e.reward.final_reward, -100.0);
                }
                _ => {}
            }
        }
    }
    assert!(
        checked >= 60,
        "only {checked} result-preserving unsafe candidates checked"
    );
}
