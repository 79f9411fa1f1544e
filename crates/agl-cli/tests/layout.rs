//! The workspace's layering, read from `cargo metadata`: dependencies point down
//! (core → gov / llm / store → train / server → spider → cli), so a library never reaches up
//! into the code built on it. `agl-train` in particular stays task-agnostic: it depends on no
//! task (`agl-spider`) and on no server (`agl-server`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each workspace crate and the workspace crates it may depend on (normal and dev).
const ALLOWED: &[(&str, &[&str])] = &[
    ("agl-core", &[]),
    ("agl-gov", &["agl-core"]),
    ("agl-llm", &["agl-core"]),
    ("agl-store", &["agl-core"]),
    (
        "agl-train",
        &["agl-core", "agl-gov", "agl-llm", "agl-store"],
    ),
    (
        "agl-server",
        &["agl-core", "agl-gov", "agl-llm", "agl-store"],
    ),
    (
        "agl-spider",
        &[
            "agl-core",
            "agl-gov",
            "agl-llm",
            "agl-store",
            "agl-train",
            "agl-server",
        ],
    ),
    // The Python module: the kernel and the seed API, beside the CLI (nothing depends on it).
    ("agl-py", &["agl-core", "agl-gov", "agl-store", "agl-train"]),
    (
        "agl-cli",
        &[
            "agl-core",
            "agl-gov",
            "agl-llm",
            "agl-store",
            "agl-train",
            "agl-server",
            "agl-spider",
        ],
    ),
];

/// Workspace crate → the other workspace crates it names as dependencies (any kind but build;
/// a crate naming itself to turn on a feature for its own tests is not an edge).
fn workspace_edges() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("build"))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|n| names.contains(n) && n != p["name"].as_str().unwrap())
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// The edges that `allowed` does not permit, as `from -> to` lines.
fn upward(edges: &BTreeMap<String, BTreeSet<String>>, allowed: &[(&str, &[&str])]) -> Vec<String> {
    let mut bad = Vec::new();
    for (from, tos) in edges {
        let permitted: &[&str] = allowed
            .iter()
            .find(|(name, _)| name == from)
            .map_or(&[], |(_, ok)| ok);
        for to in tos {
            if !permitted.contains(&to.as_str()) {
                bad.push(format!("{from} -> {to}"));
            }
        }
    }
    bad
}

#[test]
fn no_crate_depends_upwards() {
    let edges = workspace_edges();
    for (name, _) in ALLOWED {
        assert!(edges.contains_key(*name), "{name} is not in the workspace");
    }
    for name in edges.keys() {
        assert!(
            ALLOWED.iter().any(|(n, _)| n == name),
            "{name} is new: give it a place in the layering (ALLOWED)"
        );
    }
    let bad = upward(&edges, ALLOWED);
    assert!(bad.is_empty(), "dependencies that point upwards: {bad:?}");
    let train = &edges["agl-train"];
    assert!(!train.contains("agl-spider") && !train.contains("agl-server"));
}

#[test]
fn an_upward_edge_is_reported() {
    let mut edges = BTreeMap::new();
    edges.insert(
        "agl-train".to_string(),
        BTreeSet::from(["agl-core".to_string(), "agl-spider".to_string()]),
    );
    assert_eq!(upward(&edges, ALLOWED), vec!["agl-train -> agl-spider"]);
}
