//! Policy files: a YAML document that declares a [`Kernel`] (its mode, its policies, their
//! parameters, severities and penalties), the built-in presets `strict`, `standard` and
//! `permissive`, and the loader that turns either into a kernel.
//!
//! Responsible for the file format, its validation (unknown fields, wrong types and invalid
//! parameters are errors naming the file, line and field) and for building policies from it.
//! Not responsible for what the policies check (see [`crate::policies`]).
//!
//! # Format (version 1)
//! ```yaml
//! version: 1                 # required; the only version is 1
//! description: "..."         # optional, free text
//! mode: enforce              # optional: enforce (default) | audit
//! on_block: refuse           # optional: refuse (default) | error: what the LLM gateway tells
//!                            # an agent whose model output is blocked (see `OnBlock`)
//! sql_arguments:             # optional: tool arguments that carry SQL; the SQL policies
//!   - run_sql.query          # check them too (see `SqlArgument` for the long form:
//!   - tool: query_db         # database_argument, database, dialect)
//!     argument: sql
//!     database_argument: db_id
//! policies:                  # run in this order
//!   - type: sql_safety       # sql_safety | cost_control | resource_limits | tool_policy |
//!                            # rate_limit | content_safety | cedar
//!     name: sql_safety       # optional: name recorded in violations (default: the type)
//!     severity: critical     # optional: replaces the severity of every finding
//!     penalty: 100           # optional: reward penalty (positive units) of every finding
//!     effect: block          # optional: warn | modify | block, replaces every finding's effect
//!     signal: SIGKILL        # optional: SIGSTOP | SIGKILL | SIGCONT sent with every finding
//!     config: { ... }        # optional: the policy's own configuration (defaults when absent)
//! ```
//! The `config` of each type is the serde form of its configuration struct
//! ([`SqlPolicyConfig`], [`CostConfig`], [`ResourceLimitsConfig`], [`ToolPolicyConfig`],
//! [`RateLimitConfig`], [`ContentPolicyConfig`], [`CedarConfig`]); unknown fields are errors everywhere. Cedar
//! `files` are resolved relative to the policy file's directory (the current directory for
//! presets).
//!
//! # Errors
//! [`GovError::PolicyFile`] with `origin` (path or `preset:<name>`), 1-based `line`/`column`
//! and the dotted `field` path, e.g.
//! `policies.yaml:7:7: field \`policies[0].config.max_rows\`: invalid type: string "ten", expected u64`.
//! Parameters that parse but are invalid (a regex that does not compile, a negative budget, a
//! Cedar file that does not validate) are reported by [`PolicyFile::build`] with the line of
//! the policy entry.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::CheckCache;
use crate::error::GovError;
use crate::kernel::{Kernel, Policy, PolicyOptions};
use crate::policies::{
    CedarConfig, CedarPolicy, ContentPolicy, ContentPolicyConfig, CostConfig, CostControlPolicy,
    RateLimitConfig, RateLimitPolicy, ResourceLimitsConfig, ResourceLimitsPolicy, SqlPolicy,
    SqlPolicyConfig, TableStats, ToolPolicy, ToolPolicyConfig,
};
use crate::sql_arguments::SqlArgument;
use crate::types::{GovernanceMode, OnBlock};

/// The only policy-file format version.
pub const POLICY_FILE_VERSION: u32 = 1;

/// Names of the built-in presets, strictest first.
pub const PRESETS: [&str; 3] = ["strict", "standard", "permissive"];

/// The preset `agl train` and `agl policy check` use when no policy file is given.
pub const DEFAULT_PRESET: &str = "standard";

const STRICT_YAML: &str = include_str!("../presets/strict.yaml");
const STANDARD_YAML: &str = include_str!("../presets/standard.yaml");
const PERMISSIVE_YAML: &str = include_str!("../presets/permissive.yaml");

/// The YAML text of a built-in preset, `None` for an unknown name.
pub fn preset_text(name: &str) -> Option<&'static str> {
    match name {
        "strict" => Some(STRICT_YAML),
        "standard" => Some(STANDARD_YAML),
        "permissive" => Some(PERMISSIVE_YAML),
        _ => None,
    }
}

/// The policy types a file may declare (the `type` key). YAML form: snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyType {
    /// [`SqlPolicy`].
    SqlSafety,
    /// [`CostControlPolicy`].
    CostControl,
    /// [`ResourceLimitsPolicy`].
    ResourceLimits,
    /// [`ToolPolicy`].
    ToolPolicy,
    /// [`RateLimitPolicy`].
    RateLimit,
    /// [`ContentPolicy`].
    ContentSafety,
    /// [`CedarPolicy`].
    Cedar,
}

impl PolicyType {
    /// The snake_case name used in files.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyType::SqlSafety => "sql_safety",
            PolicyType::CostControl => "cost_control",
            PolicyType::ResourceLimits => "resource_limits",
            PolicyType::ToolPolicy => "tool_policy",
            PolicyType::RateLimit => "rate_limit",
            PolicyType::ContentSafety => "content_safety",
            PolicyType::Cedar => "cedar",
        }
    }
}

impl fmt::Display for PolicyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The configuration of one declared policy, by type.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyConfig {
    /// `sql_safety`.
    SqlSafety(SqlPolicyConfig),
    /// `cost_control`.
    CostControl(CostConfig),
    /// `resource_limits`.
    ResourceLimits(ResourceLimitsConfig),
    /// `tool_policy`.
    ToolPolicy(ToolPolicyConfig),
    /// `rate_limit`.
    RateLimit(RateLimitConfig),
    /// `content_safety`.
    ContentSafety(ContentPolicyConfig),
    /// `cedar`.
    Cedar(CedarConfig),
}

impl PolicyConfig {
    /// The type of this configuration.
    pub fn policy_type(&self) -> PolicyType {
        match self {
            PolicyConfig::SqlSafety(_) => PolicyType::SqlSafety,
            PolicyConfig::CostControl(_) => PolicyType::CostControl,
            PolicyConfig::ResourceLimits(_) => PolicyType::ResourceLimits,
            PolicyConfig::ToolPolicy(_) => PolicyType::ToolPolicy,
            PolicyConfig::RateLimit(_) => PolicyType::RateLimit,
            PolicyConfig::ContentSafety(_) => PolicyType::ContentSafety,
            PolicyConfig::Cedar(_) => PolicyType::Cedar,
        }
    }

    fn default_for(t: PolicyType) -> Self {
        match t {
            PolicyType::SqlSafety => PolicyConfig::SqlSafety(SqlPolicyConfig::default()),
            PolicyType::CostControl => PolicyConfig::CostControl(CostConfig::default()),
            PolicyType::ResourceLimits => {
                PolicyConfig::ResourceLimits(ResourceLimitsConfig::default())
            }
            PolicyType::ToolPolicy => PolicyConfig::ToolPolicy(ToolPolicyConfig::default()),
            PolicyType::RateLimit => PolicyConfig::RateLimit(RateLimitConfig::default()),
            PolicyType::ContentSafety => {
                PolicyConfig::ContentSafety(ContentPolicyConfig::default())
            }
            PolicyType::Cedar => PolicyConfig::Cedar(CedarConfig::default()),
        }
    }
}

/// A policy built from a [`PolicySpec`], with the options the kernel applies to it.
pub type BuiltPolicy = (Box<dyn Policy>, PolicyOptions);

/// One declared policy: the kernel-level options and the policy's own configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySpec {
    /// Name, severity, penalty, effect and signal overrides.
    pub options: PolicyOptions,
    /// The policy's configuration.
    pub config: PolicyConfig,
    /// 1-based line of the entry in its file, when known (for error messages).
    pub line: Option<usize>,
}

impl PolicySpec {
    /// The name violations of this policy carry.
    pub fn name(&self) -> &str {
        self.options
            .name
            .as_deref()
            .unwrap_or(self.config.policy_type().as_str())
    }
}

/// What building policies needs from the environment.
#[derive(Debug, Clone, Default)]
pub struct BuildEnv {
    /// Row counts per table per database, for the cost policy's SQL estimates (empty: SQL
    /// actions have no estimated cost).
    pub table_stats: TableStats,
    /// Overrides the file's `mode` when set (e.g. `agl train --governance audit`).
    pub mode: Option<GovernanceMode>,
    /// Caches parses and pure-policy findings here ([`Kernel::with_check_cache`]); kernels
    /// built from the same file and table statistics with the same cache share entries.
    pub check_cache: Option<Arc<CheckCache>>,
}

/// A parsed policy file (or preset).
///
/// Its `on_block` and `sql_arguments` reach the kernel through [`PolicyFile::build`]
/// ([`Kernel::with_on_block`], [`Kernel::with_sql_argument`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyFile {
    /// Where it came from: the path, or `preset:<name>`.
    pub origin: String,
    /// Directory relative paths inside the file (Cedar files) are resolved against; `None`
    /// for presets (the current directory is used).
    pub base_dir: Option<PathBuf>,
    /// Format version (always [`POLICY_FILE_VERSION`]).
    pub version: u32,
    /// Free-text description.
    pub description: Option<String>,
    /// The kernel's mode.
    pub mode: GovernanceMode,
    /// The policies, in the order they run.
    pub policies: Vec<PolicySpec>,
    /// What the LLM gateway tells an agent whose model output is blocked.
    pub on_block: OnBlock,
    /// Tool arguments that carry SQL, in order.
    pub sql_arguments: Vec<SqlArgument>,
}

impl PolicyFile {
    /// Reads and parses the YAML file at `path`.
    ///
    /// # Errors
    /// [`GovError::PolicyFile`] when the file cannot be read or does not parse (see the module
    /// docs).
    pub fn load(path: &Path) -> Result<Self, GovError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| GovError::PolicyFile {
            origin: origin.clone(),
            line: None,
            column: None,
            field: String::new(),
            message: format!("cannot read policy file: {e}"),
        })?;
        let base = path.parent().map(Path::to_path_buf);
        Self::parse(&text, &origin, base)
    }

    /// The built-in preset `name` (one of [`PRESETS`]).
    ///
    /// # Errors
    /// [`GovError::PolicyFile`] naming the valid presets when `name` is not one.
    pub fn preset(name: &str) -> Result<Self, GovError> {
        let text = preset_text(name).ok_or_else(|| GovError::PolicyFile {
            origin: format!("preset:{name}"),
            line: None,
            column: None,
            field: String::new(),
            message: format!(
                "no such preset; the presets are {} (or give a path to a YAML file)",
                PRESETS.join(", ")
            ),
        })?;
        Self::parse(text, &format!("preset:{name}"), None)
    }

    /// A preset name or a path: a value that names an existing file is loaded from it, one of
    /// [`PRESETS`] is the preset, anything else is an error saying neither exists.
    ///
    /// # Errors
    /// As [`PolicyFile::load`] and [`PolicyFile::preset`].
    pub fn resolve(spec: &str) -> Result<Self, GovError> {
        let path = Path::new(spec);
        if path.is_file() {
            return Self::load(path);
        }
        if preset_text(spec).is_some() {
            return Self::preset(spec);
        }
        Err(GovError::PolicyFile {
            origin: spec.to_string(),
            line: None,
            column: None,
            field: String::new(),
            message: format!("no such file, and not a preset ({})", PRESETS.join(", ")),
        })
    }

    /// Parses YAML `text`; `origin` names it in errors, `base_dir` anchors relative paths.
    ///
    /// # Errors
    /// [`GovError::PolicyFile`] with line, column and field of the first problem.
    pub fn parse(text: &str, origin: &str, base_dir: Option<PathBuf>) -> Result<Self, GovError> {
        // Pass 1: the `type` of every entry, so that pass 2 can deserialize each `config`
        // straight into its struct (streaming, so errors keep their line and column).
        let types: Vec<Option<PolicyType>> = yaml_serde::from_str::<HeadFile>(text)
            .map(|h| h.policies.into_iter().map(|e| e.kind).collect())
            .unwrap_or_default();
        let de = yaml_serde::Deserializer::from_str(text);
        let seed = FileSeed { types: &types };
        let mut track = serde_path_to_error::Track::new();
        let body = seed
            .deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
            .map_err(|inner| {
                let field = track.path().to_string();
                let loc = inner.location();
                let message = clean_yaml_message(&inner.to_string());
                let mut line = loc.as_ref().map(|l| l.line());
                let mut column = loc.as_ref().map(|l| l.column());
                // serde reports an unknown key at the start of its mapping: point at the key.
                if let (Some(l), Some(key)) = (line, unknown_key(&message))
                    && let Some((kl, kc)) = find_key(text, l, key)
                {
                    (line, column) = (Some(kl), Some(kc));
                }
                GovError::PolicyFile {
                    origin: origin.to_string(),
                    line,
                    column,
                    field: if field == "." { String::new() } else { field },
                    message,
                }
            })?;
        let lines = entry_lines(text);
        let policies = body
            .policies
            .into_iter()
            .enumerate()
            .map(|(i, (options, config))| PolicySpec {
                options,
                config,
                line: lines.get(i).copied(),
            })
            .collect();
        let file = PolicyFile {
            origin: origin.to_string(),
            base_dir,
            version: body.version,
            description: body.description,
            mode: body.mode.unwrap_or_default(),
            policies,
            on_block: body.on_block.unwrap_or_default(),
            sql_arguments: body.sql_arguments,
        };
        if file.version != POLICY_FILE_VERSION {
            return Err(file.error_at(
                Some(1),
                "version",
                format!(
                    "unsupported version {}; this agl reads version {POLICY_FILE_VERSION}",
                    file.version
                ),
            ));
        }
        Ok(file)
    }

    fn error_at(&self, line: Option<usize>, field: &str, message: String) -> GovError {
        GovError::PolicyFile {
            origin: self.origin.clone(),
            line,
            column: line.map(|_| 1),
            field: field.to_string(),
            message,
        }
    }

    /// Builds the policies, in order, with their options.
    ///
    /// # Errors
    /// [`GovError::PolicyFile`] naming the entry's line and field when a policy rejects its
    /// configuration.
    pub fn build_policies(&self, env: &BuildEnv) -> Result<Vec<BuiltPolicy>, GovError> {
        let mut out = Vec::with_capacity(self.policies.len());
        for (i, spec) in self.policies.iter().enumerate() {
            let policy = self.build_one(spec, env).map_err(|e| {
                let (field, message) = match e {
                    GovError::InvalidConfig { field, message, .. } => {
                        (format!("policies[{i}].config.{field}"), message)
                    }
                    other => (format!("policies[{i}]"), other.to_string()),
                };
                self.error_at(spec.line, &field, message)
            })?;
            if let Some(p) = spec.options.penalty.filter(|p| !p.is_finite() || *p < 0.0) {
                return Err(self.error_at(
                    spec.line,
                    &format!("policies[{i}].penalty"),
                    format!("penalty must be a finite number ≥ 0 (positive magnitude), got {p}"),
                ));
            }
            out.push((policy, spec.options.clone()));
        }
        Ok(out)
    }

    fn build_one(&self, spec: &PolicySpec, env: &BuildEnv) -> Result<Box<dyn Policy>, GovError> {
        Ok(match &spec.config {
            PolicyConfig::SqlSafety(c) => Box::new(SqlPolicy::new(c.clone())),
            PolicyConfig::CostControl(c) => Box::new(CostControlPolicy::try_new(
                c.clone(),
                env.table_stats.clone(),
            )?),
            PolicyConfig::ResourceLimits(c) => Box::new(ResourceLimitsPolicy::try_new(c.clone())?),
            PolicyConfig::ToolPolicy(c) => Box::new(ToolPolicy::new(c.clone())?),
            PolicyConfig::RateLimit(c) => Box::new(RateLimitPolicy::new(c.clone())?),
            PolicyConfig::ContentSafety(c) => Box::new(ContentPolicy::new(c.clone())?),
            PolicyConfig::Cedar(c) => {
                let base = self.base_dir.clone().unwrap_or_else(|| PathBuf::from("."));
                Box::new(CedarPolicy::from_config(c, &base)?)
            }
        })
    }

    /// Builds the kernel this file declares (no recorder; add one with
    /// [`Kernel::with_shared_recorder`]).
    ///
    /// # Errors
    /// As [`PolicyFile::build_policies`].
    pub fn build(&self, env: &BuildEnv) -> Result<Kernel, GovError> {
        let mut kernel = Kernel::new(env.mode.unwrap_or(self.mode)).with_on_block(self.on_block);
        for mark in &self.sql_arguments {
            kernel = kernel.with_sql_argument(mark.clone());
        }
        for (policy, options) in self.build_policies(env)? {
            kernel = kernel.with_boxed_policy(policy, options);
        }
        if let Some(cache) = &env.check_cache {
            kernel = kernel.with_check_cache_version(cache.clone(), self.digest(env));
        }
        Ok(kernel)
    }

    /// The policy version of the kernel `build(env)` makes, for the check cache: a SHA-256
    /// digest of the declarations (types, configurations, options, in order), the directory
    /// relative paths resolve against, and the table statistics, truncated to 63 bits. The
    /// mode is left out: it changes what the kernel does with findings, not the findings.
    fn digest(&self, env: &BuildEnv) -> u64 {
        let mut h = Sha256::new();
        for spec in &self.policies {
            h.update(format!("{:?}\n{:?}\n", spec.options, spec.config).as_bytes());
        }
        h.update(format!("{:?}\n", self.base_dir).as_bytes());
        let mut dbs: Vec<_> = env.table_stats.iter().collect();
        dbs.sort_by(|a, b| a.0.cmp(b.0));
        for (db, tables) in dbs {
            let mut tables: Vec<_> = tables.iter().collect();
            tables.sort();
            h.update(format!("{db}={tables:?}\n").as_bytes());
        }
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        u64::from_le_bytes(first) & !(1 << 63)
    }
}

/// Drops serde_yaml's own location suffix and path prefix (we report both separately).
fn clean_yaml_message(msg: &str) -> String {
    let mut m = msg.to_string();
    if let Some(i) = m.rfind(" at line ")
        && m[i..].contains(" column ")
    {
        m.truncate(i);
    }
    if let Some((prefix, rest)) = m.split_once(": ") {
        let looks_like_path = !prefix.contains(' ')
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.[]".contains(c));
        if looks_like_path && !rest.is_empty() {
            m = rest.to_string();
        }
    }
    m
}

/// The key named by serde's "unknown field `key`" message.
fn unknown_key(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split('`').next()
}

/// 1-based line and column of the first `key:` at or after 1-based line `from`.
fn find_key(text: &str, from: usize, key: &str) -> Option<(usize, usize)> {
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find_map(|(i, l)| {
            let body = l.trim_start().trim_start_matches('-').trim_start();
            let col = l.len() - body.len() + 1;
            let after = body.strip_prefix(key)?;
            after.trim_start().starts_with(':').then_some((i + 1, col))
        })
}

/// 1-based line of each `- type:` entry, in order (the conventional layout of a policy list).
fn entry_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start();
            t.strip_prefix('-')
                .map(|r| r.trim_start().starts_with("type:"))
                .unwrap_or(false)
        })
        .map(|(i, _)| i + 1)
        .collect()
}

#[derive(Deserialize)]
struct HeadFile {
    #[serde(default)]
    policies: Vec<HeadEntry>,
}

#[derive(Deserialize)]
struct HeadEntry {
    #[serde(rename = "type", default, deserialize_with = "lenient_type")]
    kind: Option<PolicyType>,
}

fn lenient_type<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<PolicyType>, D::Error> {
    Ok(PolicyType::deserialize(d).ok())
}

struct Body {
    version: u32,
    description: Option<String>,
    mode: Option<GovernanceMode>,
    policies: Vec<(PolicyOptions, PolicyConfig)>,
    on_block: Option<OnBlock>,
    sql_arguments: Vec<SqlArgument>,
}

struct FileSeed<'a> {
    types: &'a [Option<PolicyType>],
}

impl<'de> DeserializeSeed<'de> for FileSeed<'_> {
    type Value = Body;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Body, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FileSeed<'_> {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a policy file: a mapping with version, mode, description, on_block, sql_arguments, \
             policies",
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut version = None;
        let mut description = None;
        let mut mode = None;
        let mut policies = None;
        let mut on_block = None;
        let mut sql_arguments = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "version" => version = Some(map.next_value::<u32>()?),
                "description" => description = map.next_value::<Option<String>>()?,
                "mode" => mode = Some(map.next_value::<GovernanceMode>()?),
                "policies" => policies = Some(map.next_value_seed(ListSeed { types: self.types })?),
                "on_block" => on_block = Some(map.next_value::<OnBlock>()?),
                "sql_arguments" => {
                    sql_arguments = map
                        .next_value::<Option<Vec<SqlArgument>>>()?
                        .unwrap_or_default()
                }
                other => {
                    return Err(de::Error::unknown_field(
                        other,
                        &[
                            "version",
                            "description",
                            "mode",
                            "on_block",
                            "sql_arguments",
                            "policies",
                        ],
                    ));
                }
            }
        }
        Ok(Body {
            version: version.ok_or_else(|| de::Error::missing_field("version"))?,
            description,
            mode,
            policies: policies.unwrap_or_default(),
            on_block,
            sql_arguments,
        })
    }
}

struct ListSeed<'a> {
    types: &'a [Option<PolicyType>],
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = Vec<(PolicyOptions, PolicyConfig)>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = Vec<(PolicyOptions, PolicyConfig)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of policies")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(entry) = seq.next_element_seed(EntrySeed {
            kind: self.types.get(out.len()).copied().flatten(),
        })? {
            out.push(entry);
        }
        Ok(out)
    }
}

struct EntrySeed {
    /// The entry's type from pass 1 (`None` when missing or invalid; pass 2 reports it).
    kind: Option<PolicyType>,
}

impl<'de> DeserializeSeed<'de> for EntrySeed {
    type Value = (PolicyOptions, PolicyConfig);

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

const ENTRY_FIELDS: &[&str] = &[
    "type", "name", "severity", "penalty", "effect", "signal", "config",
];

impl<'de> Visitor<'de> for EntrySeed {
    type Value = (PolicyOptions, PolicyConfig);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a policy entry: a mapping with `type` and optional options and `config`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kind: Option<PolicyType> = None;
        let mut options = PolicyOptions::default();
        let mut config: Option<PolicyConfig> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "type" => kind = Some(map.next_value()?),
                "name" => options.name = map.next_value()?,
                "severity" => options.severity = map.next_value()?,
                "penalty" => options.penalty = map.next_value()?,
                "effect" => options.effect = map.next_value()?,
                "signal" => options.signal = map.next_value()?,
                "config" => match self.kind {
                    Some(t) => config = Some(map.next_value_seed(ConfigSeed(t))?),
                    // Unknown type: skip; the missing/invalid `type` is reported below or
                    // was reported when its key was read.
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
                other => return Err(de::Error::unknown_field(other, ENTRY_FIELDS)),
            }
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field("type"))?;
        let config = config.unwrap_or_else(|| PolicyConfig::default_for(kind));
        Ok((options, config))
    }
}

struct ConfigSeed(PolicyType);

impl<'de> DeserializeSeed<'de> for ConfigSeed {
    type Value = PolicyConfig;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<PolicyConfig, D::Error> {
        Ok(match self.0 {
            PolicyType::SqlSafety => PolicyConfig::SqlSafety(Deserialize::deserialize(d)?),
            PolicyType::CostControl => PolicyConfig::CostControl(Deserialize::deserialize(d)?),
            PolicyType::ResourceLimits => {
                PolicyConfig::ResourceLimits(Deserialize::deserialize(d)?)
            }
            PolicyType::ToolPolicy => PolicyConfig::ToolPolicy(Deserialize::deserialize(d)?),
            PolicyType::RateLimit => PolicyConfig::RateLimit(Deserialize::deserialize(d)?),
            PolicyType::ContentSafety => PolicyConfig::ContentSafety(Deserialize::deserialize(d)?),
            PolicyType::Cedar => PolicyConfig::Cedar(Deserialize::deserialize(d)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> (Option<usize>, String, String) {
        match PolicyFile::parse(text, "p.yaml", None) {
            Err(GovError::PolicyFile {
                line,
                field,
                message,
                ..
            }) => (line, field, message),
            other => panic!("expected a policy-file error, got {other:?}"),
        }
    }

    #[test]
    fn every_preset_parses_and_builds() {
        for name in PRESETS {
            let f = PolicyFile::preset(name).unwrap();
            assert_eq!(f.origin, format!("preset:{name}"));
            assert!(!f.policies.is_empty(), "{name}");
            f.build(&BuildEnv::default()).unwrap();
        }
        assert!(
            PolicyFile::preset("lax")
                .unwrap_err()
                .to_string()
                .contains("strict")
        );
    }

    #[test]
    fn example_files_are_the_presets() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/policies");
        for name in PRESETS {
            let path = dir.join(format!("{name}.yaml"));
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(
                Some(text.as_str()),
                preset_text(name),
                "{} differs",
                path.display()
            );
        }
    }

    #[test]
    fn options_and_config_are_read() {
        let f = PolicyFile::parse(
            "version: 1\nmode: audit\npolicies:\n  - type: sql_safety\n    name: sql\n    severity: low\n    penalty: 2.5\n    effect: warn\n    signal: SIGKILL\n    config:\n      max_statements: 3\n  - type: cost_control\n",
            "p.yaml",
            None,
        )
        .unwrap();
        assert_eq!(f.mode, GovernanceMode::Audit);
        assert_eq!(f.policies.len(), 2);
        let p = &f.policies[0];
        assert_eq!(p.name(), "sql");
        assert_eq!(p.line, Some(4));
        assert_eq!(p.options.penalty, Some(2.5));
        assert!(matches!(&p.config, PolicyConfig::SqlSafety(c) if c.max_statements == 3));
        assert_eq!(
            f.policies[1].config,
            PolicyConfig::CostControl(CostConfig::default())
        );
        let k = f.build(&BuildEnv::default()).unwrap();
        assert_eq!(k.policy_names(), vec!["sql", "cost_control"]);
        assert_eq!(k.mode(), GovernanceMode::Audit);
    }

    #[test]
    fn errors_name_line_and_field() {
        let (line, field, msg) = err(
            "version: 1\npolicies:\n  - type: sql_safety\n    config:\n      max_statements: two\n",
        );
        assert_eq!(line, Some(5));
        assert_eq!(field, "policies[0].config.max_statements");
        assert!(msg.contains("invalid type"), "{msg}");

        let (line, field, msg) =
            err("version: 1\npolicies:\n  - type: sql_safety\n    severty: high\n");
        assert_eq!(line, Some(4));
        assert!(field.starts_with("policies[0]"), "{field}");
        assert!(msg.contains("unknown field `severty`"), "{msg}");

        let (line, field, msg) =
            err("version: 1\npolicies:\n  - type: cost_control\n  - type: nope\n");
        assert_eq!(line, Some(4));
        assert_eq!(field, "policies[1].type");
        assert!(msg.contains("unknown variant `nope`"), "{msg}");

        let (_, field, msg) = err("version: 1\npolicies:\n  - severity: high\n");
        assert_eq!(field, "policies[0]");
        assert!(msg.contains("missing field `type`"), "{msg}");

        let (line, field, msg) = err("version: 2\npolicies: []\n");
        assert_eq!((line, field.as_str()), (Some(1), "version"));
        assert!(msg.contains("unsupported version 2"), "{msg}");

        let (_, _, msg) = err("version: 1\nextra: true\n");
        assert!(msg.contains("unknown field `extra`"), "{msg}");

        let f = PolicyFile::parse(
            "version: 1\npolicies:\n  - type: sql_safety\n    penalty: -3\n",
            "p.yaml",
            None,
        )
        .unwrap();
        let e = f.build(&BuildEnv::default()).unwrap_err().to_string();
        assert!(
            e.starts_with("p.yaml:3:") && e.contains("policies[0].penalty") && e.contains("≥ 0"),
            "{e}"
        );
    }

    #[test]
    fn resource_limits_entries_are_read_and_validated() {
        let f = PolicyFile::parse(
            "version: 1\npolicies:\n  - type: resource_limits\n    config:\n      max_bytes: 16\n",
            "p.yaml",
            None,
        )
        .unwrap();
        assert_eq!(
            f.policies[0].config,
            PolicyConfig::ResourceLimits(ResourceLimitsConfig {
                max_bytes: 16,
                ..ResourceLimitsConfig::default()
            })
        );
        let k = f.build(&BuildEnv::default()).unwrap();
        assert_eq!(k.policy_names(), vec!["resource_limits"]);

        let (line, field, msg) = err(
            "version: 1\npolicies:\n  - type: resource_limits\n    config:\n      max_rows: 3\n",
        );
        assert_eq!(line, Some(5));
        assert!(msg.contains("unknown field `max_rows`"), "{field}: {msg}");

        let f = PolicyFile::parse(
            "version: 1\npolicies:\n  - type: resource_limits\n    config: { max_cross_joined_tables: 0 }\n",
            "p.yaml",
            None,
        )
        .unwrap();
        let e = f.build(&BuildEnv::default()).unwrap_err().to_string();
        assert!(
            e.starts_with("p.yaml:3:") && e.contains("policies[0].config.max_cross_joined_tables"),
            "{e}"
        );
    }

    #[test]
    fn on_block_and_sql_arguments_are_read_and_reach_the_kernel() {
        let f = PolicyFile::parse(
            "version: 1\non_block: error\nsql_arguments:\n  - run_sql.query\n  - tool: q\n    argument: sql\n    database_argument: db\n    dialect: mysql\npolicies: []\n",
            "p.yaml",
            None,
        )
        .unwrap();
        assert_eq!(f.on_block, OnBlock::Error);
        let want = vec![
            SqlArgument::new("run_sql", "query"),
            SqlArgument::new("q", "sql")
                .with_database_argument("db")
                .with_dialect(crate::SqlDialect::Mysql),
        ];
        assert_eq!(f.sql_arguments, want);
        let k = f.build(&BuildEnv::default()).unwrap();
        assert_eq!(k.on_block(), OnBlock::Error);
        assert_eq!(k.sql_arguments(), want.as_slice());
        // Defaults.
        let f = PolicyFile::parse("version: 1\n", "p.yaml", None).unwrap();
        assert_eq!(f.on_block, OnBlock::Refuse);
        assert!(f.sql_arguments.is_empty());

        let (line, field, msg) = err("version: 1\non_block: ignore\n");
        assert_eq!((line, field.as_str()), (Some(2), "on_block"));
        assert!(msg.contains("unknown variant `ignore`"), "{msg}");
        let (line, field, msg) = err("version: 1\nsql_arguments:\n  - run_sql\n");
        assert_eq!((line, field.as_str()), (Some(3), "sql_arguments[0]"));
        assert!(msg.contains("<tool>.<argument>"), "{msg}");
        let (line, field, msg) = err(
            "version: 1\nsql_arguments:\n  - tool: run_sql\n    argument: query\n    databse: x\n",
        );
        assert_eq!(line, Some(5), "{field}: {msg}");
        assert!(field.starts_with("sql_arguments[0]"), "{field}");
        assert!(msg.contains("unknown field `databse`"), "{msg}");
    }

    #[test]
    fn display_has_file_line_column_field() {
        let e = PolicyFile::parse(
            "version: 1\npolicies:\n  - type: sql_safety\n    config:\n      max_statements: two\n",
            "policies/x.yaml",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("policies/x.yaml:5:")
                && e.contains("field `policies[0].config.max_statements`"),
            "{e}"
        );
    }
}
