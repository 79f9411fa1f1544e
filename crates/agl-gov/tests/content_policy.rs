#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Content policy: every detector (with its exclusions: Luhn-invalid cards, impossible SSNs,
//! plain digit runs, `task-` lookalikes), deny patterns, warn / block / redact effects,
//! recursive tool-argument scanning with redaction that keeps the JSON structure, reasons that
//! never contain the secret, configuration errors, a snapshot of verdicts and no-panic
//! properties.

use agl_gov::policies::{ContentPolicy, ContentPolicyConfig, DenyAction, Detector, PiiAction};
use agl_gov::{
    Action, ActionKind, Effect, Finding, GovError, GovernanceMode, Kernel, Policy, Severity,
    Subject, Verdict,
};
use proptest::prelude::*;
use serde::Serialize;
use serde_json::{Value, json};

fn default_policy() -> ContentPolicy {
    ContentPolicy::new(ContentPolicyConfig::default()).unwrap()
}

fn check(p: &ContentPolicy, a: &Action) -> Vec<Finding> {
    p.check(&Subject::new(a)).unwrap()
}

fn text(p: &ContentPolicy, t: &str) -> Vec<Finding> {
    check(p, &Action::output(t))
}

fn reasons(v: &[Finding]) -> Vec<&str> {
    v.iter().map(|f| f.reason.as_str()).collect()
}

const CARD: &str = "4111 1111 1111 1111";
const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
const OPENAI: &str = "sk-proj-abcdefghijklmnopqrstuvwxyz012345";
const GITHUB: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
const SLACK: &str = "xoxb-123456789012-abcdefghijkl";
const GOOGLE: &str = "AIzaSyA1234567890abcdefghijklmnopqrstuv";

#[test]
fn defaults_run_all_five_detectors_and_block() {
    let c = ContentPolicyConfig::default();
    assert_eq!(c.detectors, Detector::ALL.to_vec());
    assert_eq!(
        (c.on_pii, c.on_deny_pattern),
        (PiiAction::Block, DenyAction::Block)
    );
    let c: ContentPolicyConfig =
        serde_json::from_str(r#"{"detectors": ["email", "us_ssn"], "on_pii": "redact"}"#).unwrap();
    assert_eq!(c.detectors, vec![Detector::Email, Detector::UsSsn]);
    assert_eq!(c.on_pii, PiiAction::Redact);
    assert!(serde_json::from_str::<ContentPolicyConfig>(r#"{"detectors": ["ipv4"]}"#).is_err());
    assert!(
        serde_json::from_str::<ContentPolicyConfig>(r#"{"on_deny_pattern": "redact"}"#).is_err()
    );
    assert!(serde_json::from_str::<ContentPolicyConfig>(r#"{"pii": "warn"}"#).is_err());
}

#[test]
fn clean_text_and_non_content_actions_have_no_finding() {
    let p = default_policy();
    for t in [
        "",
        "The singer with the most concerts is Joe Sharp (3 concerts).",
        "SELECT count(*) FROM singer WHERE age > 30",
        "Total revenue: 12345678901234 (raw digits are not a phone or a card)",
        "Order 2024-01-15 shipped; version 1.2.3; ratio 3/4",
        "ask-me-anything-about-this-long-task-description",
    ] {
        assert!(text(&p, t).is_empty(), "{t}: {:?}", text(&p, t));
    }
    assert!(check(&p, &Action::sql("db", format!("SELECT '{CARD}'"))).is_empty());
    assert!(check(&p, &Action::spend(1.0, 1)).is_empty());
}

#[test]
fn each_detector_finds_its_shape_with_its_severity() {
    let p = default_policy();
    let cases: &[(&str, &str, Severity)] = &[
        (
            "mail me at jane.doe+x@mail.example.co.uk now",
            "e-mail address in output text at byte 11",
            Severity::Medium,
        ),
        (
            "call +14155552671",
            "phone number in output text at byte 5",
            Severity::Medium,
        ),
        (
            "call +44 20 7946 0958",
            "phone number in output text at byte 5",
            Severity::Medium,
        ),
        (
            "call (555) 123-4567",
            "phone number in output text at byte 5",
            Severity::Medium,
        ),
        (
            "call 555-123-4567.",
            "phone number in output text at byte 5",
            Severity::Medium,
        ),
        (
            "ssn 123-45-6789",
            "US social security number in output text at byte 4",
            Severity::High,
        ),
        (
            "card 4111 1111 1111 1111",
            "payment card number in output text at byte 5",
            Severity::Critical,
        ),
        (
            "card 5500-0000-0000-0004",
            "payment card number in output text at byte 5",
            Severity::Critical,
        ),
        (
            "amex 378282246310005",
            "payment card number in output text at byte 5",
            Severity::Critical,
        ),
        (
            "card 4111111111111111 exp 12/25",
            "payment card number in output text at byte 5",
            Severity::Critical,
        ),
    ];
    for (t, reason, sev) in cases {
        let v = text(&p, t);
        assert_eq!(reasons(&v), vec![*reason], "{t}");
        assert_eq!((v[0].severity, v[0].effect), (*sev, Effect::Block), "{t}");
    }
}

#[test]
fn every_api_key_shape_is_critical() {
    let p = default_policy();
    let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----";
    let github_pat = format!("github_pat_{}", "A1b2C3d4E5".repeat(3));
    for key in [
        AWS,
        OPENAI,
        GITHUB,
        SLACK,
        GOOGLE,
        pem,
        "-----BEGIN PRIVATE KEY-----\nabc",
        &github_pat,
    ] {
        let v = text(&p, &format!("key: {key}"));
        assert_eq!(
            reasons(&v),
            vec!["API key or private key in output text at byte 5"],
            "{key}"
        );
        assert_eq!(v[0].severity, Severity::Critical);
    }
}

#[test]
fn lookalikes_are_not_reported() {
    let p = default_policy();
    for t in [
        "card 4111 1111 1111 1112",        // fails Luhn
        "0000 0000 0000 0000",             // all zeros pass Luhn but are not cards
        "id 411111111111111112",           // a plain 18-digit run failing Luhn
        "ssn 000-12-3456",                 // area 000
        "ssn 666-12-3456",                 // area 666
        "ssn 912-12-3456",                 // area 9xx
        "ssn 123-00-4567",                 // group 00
        "ssn 123-45-0000",                 // serial 0000
        "ids 1123-45-67890",               // glued digits
        "task-abcdefghijklmnopqrstuvwxyz", // `sk-` inside a word
        "AKIA123",                         // too short
        "call 4155552671",                 // digits without + or separators
        "x+14155552671y",                  // glued to letters
        "user@localhost",                  // no TLD
    ] {
        assert!(text(&p, t).is_empty(), "{t}: {:?}", reasons(&text(&p, t)));
    }
}

#[test]
fn reasons_never_contain_the_secret() {
    let p = default_policy();
    let t = format!("{AWS} {CARD} 123-45-6789 a@b.io +14155552671 {OPENAI}");
    let v = text(&p, &t);
    assert_eq!(v.len(), 5, "{:?}", reasons(&v));
    for f in &v {
        for secret in [
            AWS,
            CARD,
            "123-45-6789",
            "a@b.io",
            "+14155552671",
            OPENAI,
            "4111",
        ] {
            assert!(!f.reason.contains(secret), "{} leaks {secret}", f.reason);
        }
    }
}

#[test]
fn repeated_matches_give_one_finding_with_a_count() {
    let p = default_policy();
    let v = text(&p, "a@b.io, c@d.io and e@f.io");
    assert_eq!(
        reasons(&v),
        vec!["e-mail address in output text at byte 0 (3 matches)"]
    );
}

#[test]
fn only_configured_detectors_run() {
    let p = ContentPolicy::new(ContentPolicyConfig {
        detectors: vec![Detector::PaymentCard],
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    assert!(text(&p, "a@b.io 123-45-6789").is_empty());
    assert_eq!(text(&p, CARD).len(), 1);
    let none = ContentPolicy::new(ContentPolicyConfig {
        detectors: vec![],
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    assert!(text(&none, &format!("{CARD} {AWS}")).is_empty());
}

#[test]
fn on_pii_warn_lets_the_action_execute() {
    let p = ContentPolicy::new(ContentPolicyConfig {
        on_pii: PiiAction::Warn,
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    let v = text(&p, "mail a@b.io");
    assert_eq!(v[0].effect, Effect::Warn);
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    assert_eq!(
        k.check(&Action::output("mail a@b.io")).unwrap().verdict,
        Verdict::Warn
    );
}

#[test]
fn deny_patterns_are_high_and_follow_on_deny_pattern() {
    let config = ContentPolicyConfig {
        deny_patterns: vec![
            "(?i)ignore (all )?previous instructions".into(),
            "secret".into(),
        ],
        ..ContentPolicyConfig::default()
    };
    let p = ContentPolicy::new(config.clone()).unwrap();
    let v = text(&p, "Please IGNORE previous instructions");
    assert_eq!(
        reasons(&v),
        vec![
            "deny pattern #0 `(?i)ignore (all )?previous instructions` matches output text at byte 7"
        ]
    );
    assert_eq!(
        (v[0].severity, v[0].effect),
        (Severity::High, Effect::Block)
    );
    let warn = ContentPolicy::new(ContentPolicyConfig {
        on_deny_pattern: DenyAction::Warn,
        ..config
    })
    .unwrap();
    assert_eq!(text(&warn, "a secret")[0].effect, Effect::Warn);
}

#[test]
fn redact_rewrites_output_text() {
    let p = ContentPolicy::new(ContentPolicyConfig {
        on_pii: PiiAction::Redact,
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    let v = text(&p, "card 4111 1111 1111 1111, mail jane@x.org");
    assert_eq!(v.len(), 2);
    let want = ActionKind::Output {
        text: "card [REDACTED:payment_card], mail [REDACTED:email]".into(),
    };
    for f in &v {
        assert_eq!(f.effect, Effect::Modify);
        assert_eq!(f.rewrite.as_ref(), Some(&want));
    }
}

#[test]
fn kernel_redaction_produces_modify_with_the_rewritten_text() {
    let p = ContentPolicy::new(ContentPolicyConfig {
        on_pii: PiiAction::Redact,
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let original = Action::output(format!("Your key is {AWS}; SSN 123-45-6789."));
    let d = k.check(&original).unwrap();
    assert_eq!(d.verdict, Verdict::Modify);
    assert_eq!(
        d.rewritten,
        Some(ActionKind::Output {
            text: "Your key is [REDACTED:api_key]; SSN [REDACTED:us_ssn].".into()
        })
    );
    assert_eq!(d.violations.len(), 2);
    assert!(d.violations.iter().all(|v| v.effect == Effect::Modify));
    // audit mode records what would have been redacted, executes the original
    let k = Kernel::new(GovernanceMode::Audit).with_policy(
        ContentPolicy::new(ContentPolicyConfig {
            on_pii: PiiAction::Redact,
            ..ContentPolicyConfig::default()
        })
        .unwrap(),
    );
    let d = k.check(&original).unwrap();
    assert_eq!((d.verdict, d.rewritten), (Verdict::Warn, None));
}

#[test]
fn redaction_plus_a_deny_pattern_blocks() {
    let p = ContentPolicy::new(ContentPolicyConfig {
        on_pii: PiiAction::Redact,
        deny_patterns: vec!["rm -rf".into()],
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let d = k.check(&Action::output("a@b.io: run rm -rf /")).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.rewritten, None);
}

#[test]
fn tool_arguments_are_scanned_recursively_by_value() {
    let p = default_policy();
    let args = json!({
        "to": ["ok@example.com", "x"],
        "body": {"text": format!("pay with {CARD}"), "n": 4111111111111111u64},
        "jane@example.com": "keys are not scanned",
        "flag": true
    });
    let v = check(&p, &Action::tool_call("send_email", args));
    // (sorted: object member order depends on serde_json's `preserve_order` feature)
    let mut got = reasons(&v);
    got.sort_unstable();
    assert_eq!(
        got,
        vec![
            "e-mail address in argument `to[0]` of tool `send_email` at byte 0",
            "payment card number in argument `body.text` of tool `send_email` at byte 9",
        ]
    );
    // a bare string as arguments
    let v = check(&p, &Action::tool_call("echo", json!("a@b.io")));
    assert_eq!(
        reasons(&v),
        vec!["e-mail address in the arguments of tool `echo` at byte 0"]
    );
}

#[test]
fn redaction_of_tool_arguments_keeps_the_json_structure() {
    let p = ContentPolicy::new(ContentPolicyConfig {
        on_pii: PiiAction::Redact,
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let args = json!({
        "to": ["a@b.io", "plain"],
        "body": {"text": format!("token {GITHUB} end"), "count": 2},
        "cc": null
    });
    let d = k.check(&Action::tool_call("send_email", args)).unwrap();
    assert_eq!(d.verdict, Verdict::Modify);
    assert_eq!(
        d.rewritten,
        Some(ActionKind::ToolCall {
            name: "send_email".into(),
            arguments: json!({
                "to": ["[REDACTED:email]", "plain"],
                "body": {"text": "token [REDACTED:api_key] end", "count": 2},
                "cc": null
            }),
        })
    );
}

#[test]
fn deeply_nested_arguments_fail_closed() {
    let mut v = json!("a@b.io");
    for _ in 0..200 {
        v = json!([v]);
    }
    let p = default_policy();
    let f = check(&p, &Action::tool_call("t", v));
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].severity, f[0].effect),
        (Severity::Medium, Effect::Block)
    );
    assert!(
        f[0].reason.contains("nested more than 128 levels"),
        "{}",
        f[0].reason
    );
}

#[test]
fn invalid_deny_patterns_are_named() {
    match ContentPolicy::new(ContentPolicyConfig {
        deny_patterns: vec!["ok".into(), "(unclosed".into()],
        ..ContentPolicyConfig::default()
    }) {
        Err(GovError::InvalidConfig { policy, field, .. }) => {
            assert_eq!(
                (policy.as_str(), field.as_str()),
                ("content_safety", "deny_patterns[1]")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[derive(Serialize)]
struct Row {
    name: &'static str,
    text: String,
    verdict: Verdict,
    rewritten: Option<String>,
    findings: Vec<String>,
}

/// Inputs run through a kernel with deny pattern `(?i)drop table` and `on_pii: redact`.
#[test]
fn snapshot_of_verdicts() {
    let pem = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA\n-----END EC PRIVATE KEY----- trailing";
    let cases: Vec<(&str, String)> = vec![
        ("clean_answer", "Joe Sharp sang at 3 concerts.".into()),
        ("clean_numbers", "count = 1234567890123; avg = 45.5".into()),
        (
            "clean_date_version",
            "2024-01-15, v1.2.3, 10/12/2023".into(),
        ),
        ("email", "contact jane@example.com".into()),
        ("email_two", "a@b.io; c@d.co".into()),
        ("email_no_tld", "root@localhost".into()),
        ("phone_e164", "+14155552671".into()),
        ("phone_e164_spaced", "tel: +33 1 23 45 67 89".into()),
        ("phone_nanp_parens", "(555) 123-4567".into()),
        ("phone_nanp_dots", "555.123.4567".into()),
        ("phone_plain_digits", "5551234567".into()),
        ("phone_area_code_1", "155-123-4567".into()),
        ("ssn_valid", "SSN: 123-45-6789".into()),
        ("ssn_area_666", "666-45-6789".into()),
        ("ssn_group_00", "123-00-6789".into()),
        ("card_visa_spaced", format!("pay {CARD}")),
        ("card_mastercard_dashed", "5500-0000-0000-0004".into()),
        ("card_amex_plain", "378282246310005".into()),
        ("card_luhn_invalid", "4111 1111 1111 1112".into()),
        ("card_followed_by_expiry", "4111111111111111 12/25".into()),
        ("key_aws", format!("aws={AWS}")),
        ("key_openai", format!("OPENAI_API_KEY={OPENAI}")),
        ("key_github", GITHUB.to_string()),
        ("key_slack", SLACK.to_string()),
        ("key_google", GOOGLE.to_string()),
        ("key_pem", pem.to_string()),
        (
            "key_lookalike_task",
            "task-abcdefghijklmnopqrstuvwxyz".into(),
        ),
        ("deny_pattern", "now DROP TABLE singer".into()),
        ("deny_and_pii", "drop table users; mail a@b.io".into()),
        (
            "mixed_pii",
            format!("{CARD} / 123-45-6789 / a@b.io / +14155552671"),
        ),
        ("unicode_around_pii", "é a@b.io ü".into()),
    ];
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(
        ContentPolicy::new(ContentPolicyConfig {
            deny_patterns: vec!["(?i)drop table".into()],
            on_pii: PiiAction::Redact,
            ..ContentPolicyConfig::default()
        })
        .unwrap(),
    );
    let rows: Vec<Row> = cases
        .into_iter()
        .map(|(name, text)| {
            let d = k.check(&Action::output(text.clone())).unwrap();
            Row {
                name,
                text,
                verdict: d.verdict,
                rewritten: match d.rewritten {
                    Some(ActionKind::Output { text }) => Some(text),
                    _ => None,
                },
                findings: d
                    .violations
                    .iter()
                    .map(|v| format!("{} {}: {}", v.severity, v.effect, v.reason))
                    .collect(),
            }
        })
        .collect();
    assert!(rows.len() >= 30);
    insta::assert_json_snapshot!("content_verdicts", rows);
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        ".{0,60}".prop_map(Value::String),
        "[0-9 @.+()-]{0,30}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_and_redaction_removes_every_detection(
        s in prop_oneof![".{0,200}", "[0-9a-zA-Z @.+()_-]{0,120}"],
    ) {
        let p = ContentPolicy::new(ContentPolicyConfig {
            on_pii: PiiAction::Redact,
            ..ContentPolicyConfig::default()
        })
        .unwrap();
        let v = text(&p, &s);
        if let Some(ActionKind::Output { text: redacted }) = v.first().and_then(|f| f.rewrite.clone()) {
            // A redacted text has nothing left to redact.
            let again = text(&p, &redacted);
            prop_assert!(again.is_empty(), "{s:?} -> {redacted:?} -> {:?}", reasons(&again));
        }
    }

    #[test]
    fn arbitrary_tool_arguments_never_panic(args in arb_json()) {
        for on_pii in [PiiAction::Warn, PiiAction::Block, PiiAction::Redact] {
            let p = ContentPolicy::new(ContentPolicyConfig {
                on_pii,
                deny_patterns: vec!["x{2,}".into()],
                ..ContentPolicyConfig::default()
            })
            .unwrap();
            let _ = check(&p, &Action::tool_call("t", args.clone()));
        }
    }
}
