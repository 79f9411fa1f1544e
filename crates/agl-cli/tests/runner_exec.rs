//! `agl runner --exec CMD` against a real `agl store`: rollouts are served by a shell command
//! (rewards read from its stdout, the per-attempt LLM URL in its environment), SIGTERM kills a
//! running command's process group and fails its attempt, and bad flags are one-line errors.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use agl_core::{
    AttemptStatus, EnqueueRolloutRequest, LlmResource, NamedResources, Resource, semconv,
};
use agl_server::StoreClient;
use agl_store::LightningStore;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

mod common;
use common::{Reaper, agl, agl_command, assert_one_line_failure, start_store};

/// A task `n` prints the reward `n` and records the LLM URL it was given; the task `"hang"`
/// starts a background `sleep 60`, records its pid, and waits.
const AGENT: &str = r#"read -r t
printf '%s\n' "$OPENAI_BASE_URL" > "$DIR/$AGL_ROLLOUT_ID.url"
if [ "$t" = '"hang"' ]; then sleep 60 & echo $! > "$DIR/hang.pid"; wait; fi
echo "{\"reward\": $t}"
"#;

fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    // A killed process whose parent died is a zombie until it is reaped: that is dead too.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runner_serves_rollouts_and_sigterm_kills_a_running_command() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agent.sh"), AGENT).unwrap();
    let (_store, url) = start_store(&[]);
    let client = StoreClient::new(&url).unwrap();
    let mut resources = NamedResources::new();
    resources.insert(
        "main_llm".into(),
        Resource::ProxyLlm(LlmResource {
            endpoint: "http://127.0.0.1:9/v1".into(),
            model: "policy-v1".into(),
            api_key: None,
            sampling_parameters: Default::default(),
        }),
    );
    client.update_resources("exec-v1", resources).await.unwrap();
    let requests = [json!(3), json!(5), json!(8)]
        .into_iter()
        .map(|n| {
            let mut r = EnqueueRolloutRequest::new(n);
            r.resources_id = Some("exec-v1".into());
            r
        })
        .collect();
    let ids: Vec<String> = client
        .enqueue_many(requests)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.rollout_id)
        .collect();

    let mut runner = Reaper(
        agl_command()
            .args(["runner", "--store-url", &url, "--workers", "2"])
            .args(["--max-idle-ms", "5", "--timeout", "120"])
            .arg("--exec")
            .arg(format!("sh '{}'", dir.path().join("agent.sh").display()))
            .env("DIR", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let done = client
        .wait_for_rollouts(&ids, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(done.len(), 3, "rollouts not finished in time");
    for (id, want) in ids.iter().zip([3.0, 5.0, 8.0]) {
        let a = client.get_latest_attempt(id).await.unwrap().unwrap();
        assert_eq!(a.status, AttemptStatus::Succeeded, "{a:?}");
        assert_eq!(a.metadata.as_ref().unwrap()["reward"], json!(want));
        let spans = client.list_spans(id, Some(&a.attempt_id)).await.unwrap();
        assert_eq!(semconv::find_final_reward(&spans), Some(want));
        let url = std::fs::read_to_string(dir.path().join(format!("{id}.url"))).unwrap();
        assert_eq!(
            url.trim(),
            format!(
                "http://127.0.0.1:9/rollout/{id}/attempt/{}/v1",
                a.attempt_id
            )
        );
    }

    // A hanging command: SIGTERM must kill its process group and fail its attempt.
    let hang = client
        .enqueue_rollout(EnqueueRolloutRequest::new(json!("hang")))
        .await
        .unwrap();
    let pidfile = dir.path().join("hang.pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid: i32 = loop {
        assert!(
            Instant::now() < deadline,
            "the hanging command never started"
        );
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(alive(pid));
    kill(Pid::from_raw(runner.0.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = runner.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the runner ignored SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut runner.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("stopped after 4 rollouts"), "{err}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the command's child {pid} survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = client
        .get_latest_attempt(&hang.rollout_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, AttemptStatus::Failed, "{a:?}");
    assert_eq!(a.metadata.unwrap()["cancelled"], json!(true));
}

#[test]
fn bad_exec_flags_are_one_line_errors() {
    let o = agl(&["runner", "--store-url", "http://127.0.0.1:9", "--exec", " "]);
    assert_one_line_failure(&o, "--exec");
    for t in ["0", "-1", "NaN"] {
        let timeout = format!("--timeout={t}");
        let o = agl(&[
            "runner",
            "--store-url",
            "http://127.0.0.1:9",
            "--exec",
            "true",
            &timeout,
        ]);
        assert_one_line_failure(&o, "--timeout");
    }
    let o = agl(&[
        "runner",
        "--store-url",
        "http://127.0.0.1:9",
        "--exec",
        "true",
        "--data",
        "data/spider",
    ]);
    assert!(!o.status.success());
    assert!(common::stderr(&o).contains("--data"));
}
