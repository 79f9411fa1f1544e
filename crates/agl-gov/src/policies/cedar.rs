//! [`CedarPolicy`] (`cedar`): authorises actions with [Cedar](https://www.cedarpolicy.com)
//! policies (`cedar-policy` 4.14).
//!
//! Responsible for turning an [`Action`] into a Cedar request (documented schema below),
//! loading and validating `.cedar` policy files against that schema, and turning Cedar's
//! decision into [`Finding`]s. Not responsible for the verdict rule (see [`crate::Kernel`]) nor
//! for locating policy files named by a YAML policy file (the loader resolves paths and calls
//! [`CedarPolicy::from_config`] or [`CedarPolicy::from_files`]).
//!
//! # Request schema
//! The schema is [`CEDAR_SCHEMA`] (file `agl.cedarschema`, namespace `Agl`). Every policy file
//! is validated against it in strict mode at load; a validation error is a load error naming
//! the file, the policy id and Cedar's message.
//!
//! | Action kind | principal | action | resource |
//! |---|---|---|---|
//! | `sql` | `Agl::Agent::"<agent_id>"` | `Agl::Action::"sql"` | `Agl::Database::"<database>"` |
//! | `tool_call` | `Agl::Agent::"<agent_id>"` | `Agl::Action::"tool_call"` | `Agl::Tool::"<name>"` |
//! | `output` | `Agl::Agent::"<agent_id>"` | `Agl::Action::"output"` | `Agl::Channel::"output"` |
//! | `spend` | `Agl::Agent::"<agent_id>"` | `Agl::Action::"spend"` | `Agl::Budget::"run"` |
//!
//! `<agent_id>` is `context.agent_id`, or `anonymous` when absent. Entity ids are taken
//! verbatim (any string, quotes and NUL included). The principal and resource entities carry
//! no attributes and no parents (so the entity store passed to Cedar is empty, which Cedar
//! treats identically).
//!
//! Context record (`context.<field>` in policies):
//!
//! | Field | Cedar type | Actions | Value |
//! |---|---|---|---|
//! | `rollout_id` | `String` | all | `context.rollout_id`, `""` when none |
//! | `step` | `Long` | all | `context.step`, `-1` when none |
//! | `rollout_spend_micros` | `Long` | all | `context.rollout_spend_usd` × 10⁶ rounded, `-1` when unknown |
//! | `run_spend_micros` | `Long` | all | `context.run_spend_usd` × 10⁶ rounded, `-1` when unknown |
//! | `sql` | `String` | sql | the SQL text, byte for byte |
//! | `dialect` | `String` | sql | `sqlite`, `mysql`, `postgres` or `generic` |
//! | `statement_kinds` | `Set<String>` | sql | lowercase kind of every statement node, nested ones included (`select`, `insert`, `drop`, …, see [`crate::StatementKind`]); empty when the SQL does not parse |
//! | `tables` | `Set<String>` | sql | lowercase names of the tables read or written (sqlparser's relations, plus the targets of `DROP TABLE`/`DROP VIEW`); a qualified name appears both whole (`main.singer`) and as its last part (`singer`); empty when the SQL does not parse |
//! | `statement_count` | `Long` | sql | number of top-level statements, `0` when the SQL does not parse |
//! | `parse_error` | `Bool` | sql | `true` when the SQL does not parse in its dialect |
//! | `arguments_json` | `String` | tool_call | the arguments as compact JSON, object keys sorted |
//! | `argument_names` | `Set<String>` | tool_call | top-level keys when the arguments are an object, else empty |
//! | `text` | `String` | output | the text |
//! | `length` | `Long` | output | length of the text in Unicode scalar values (characters) |
//! | `usd_micros` | `Long` | spend | the action's `usd` × 10⁶ rounded |
//! | `tokens` | `Long` | spend | the action's `tokens` (saturating at 2⁶³−1) |
//!
//! Cedar has no floating-point numbers, hence micro-USD. A non-finite or negative USD amount
//! cannot be represented and makes [`Policy::check`] return an error (the kernel then blocks).
//!
//! # Decisions
//! Cedar semantics: an action is allowed when some `permit` applies and no `forbid` does, so
//! `forbid` wins and "nothing applies" is a deny. On `Allow` there are no findings. On `Deny`
//! there is one finding per `forbid` policy that applied, in load order, or, when none did,
//! one blocking high-severity finding "no permit policy applies (Cedar default deny)".
//!
//! Annotations on a `forbid` policy shape its finding (invalid values are load errors):
//!
//! | Annotation | Meaning | Default |
//! |---|---|---|
//! | `@id("name")` | policy id used in reasons and errors (must be unique) | `<origin>:<index>` (0-based position in its file) |
//! | `@severity("critical")` | `low`, `medium`, `high` or `critical` | `high` |
//! | `@penalty("25")` | reward penalty, a non-negative number | the severity's default |
//! | `@effect("warn")` | `block` or `warn` | `block` |
//! | `@reason("text")` | the finding's reason | `forbidden by Cedar policy <id>` |
//!
//! A policy that errors during evaluation (integer overflow, an extension function given a
//! bad value, …) is skipped by Cedar, which for a `forbid` means failing open; so any
//! evaluation error makes [`Policy::check`] return [`GovError::Cedar`], which the kernel turns
//! into a blocking violation (fail closed).
//!
//! # Performance
//! The schema, the policy set (split by the action its scope names) and the authorizer are
//! built once. Each check builds the request (two entity ids and the context record), reuses
//! the SQL already parsed by [`Subject::sql`], and evaluates only the policies whose action
//! scope can match. The entity store is empty: an entity absent from the store has no
//! attributes and no parents, which is exactly what the principal and resource are.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cedar_policy::{
    ActionConstraint, Authorizer, Context, Decision as CedarDecision, Entities, EntityId,
    EntityTypeName, EntityUid, PolicyId, PolicySet, Request, RestrictedExpression, Schema,
    ValidationMode, Validator,
};
use serde::{Deserialize, Serialize};
use sqlparser::ast::{ObjectType, Statement, visit_relations};

use super::sql::statement_kinds;
use super::{display_name, name_parts};
use crate::action::{Action, ActionKind, Context as ActionContext};
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Effect, Finding, Severity};

/// Name of this policy in violations: `cedar`.
pub const CEDAR_POLICY_NAME: &str = "cedar";

/// The Cedar schema (`.cedarschema` text) every policy is validated against; see the module
/// documentation for what each field holds.
pub const CEDAR_SCHEMA: &str = include_str!("agl.cedarschema");

/// Origin used in errors when the failure is not tied to one policy source.
const SCHEMA_ORIGIN: &str = "agl.cedarschema";

/// Reason of the finding produced when no policy applies.
pub const DEFAULT_DENY_REASON: &str = "no permit policy applies (Cedar default deny)";

/// Configuration of [`CedarPolicy`] as written in a YAML policy file
/// (`{type: cedar, config: {files: [...], source: "..."}}`). At least one policy must be given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CedarConfig {
    /// `.cedar` policy files, loaded in order; relative paths are resolved against the
    /// directory passed to [`CedarPolicy::from_config`] (the policy file's directory). Default
    /// empty.
    pub files: Vec<PathBuf>,
    /// Inline Cedar policy text, loaded after the files under the origin name `inline`.
    /// Default none.
    pub source: Option<String>,
}

/// What a `forbid` policy's annotations say about its finding.
#[derive(Debug, Clone)]
struct Meta {
    /// Position in load order (files in order, policies in file order).
    order: usize,
    /// The file path or inline-source name.
    origin: String,
    severity: Severity,
    penalty: Option<f64>,
    effect: Effect,
    reason: String,
}

/// Entity type names and action uids, parsed once.
#[derive(Debug, Clone)]
struct Names {
    agent: EntityTypeName,
    database: EntityTypeName,
    tool: EntityTypeName,
    channel: EntityTypeName,
    budget: EntityTypeName,
    sql: EntityUid,
    tool_call: EntityUid,
    output: EntityUid,
    spend: EntityUid,
}

impl Names {
    fn new() -> Result<Self, GovError> {
        let ty = |s: &str| {
            EntityTypeName::from_str(s).map_err(|e| GovError::Cedar {
                origin: SCHEMA_ORIGIN.into(),
                message: format!("bad entity type name `{s}`: {e}"),
            })
        };
        let action_type = ty("Agl::Action")?;
        let act =
            |id: &str| EntityUid::from_type_name_and_id(action_type.clone(), EntityId::new(id));
        Ok(Names {
            agent: ty("Agl::Agent")?,
            database: ty("Agl::Database")?,
            tool: ty("Agl::Tool")?,
            channel: ty("Agl::Channel")?,
            budget: ty("Agl::Budget")?,
            sql: act("sql"),
            tool_call: act("tool_call"),
            output: act("output"),
            spend: act("spend"),
        })
    }
}

/// A policy that authorises every action with a Cedar policy set (see the module
/// documentation for the request schema and the annotations).
pub struct CedarPolicy {
    /// The policies whose action scope can match each action kind, indexed by
    /// [`action_index`]: Cedar evaluates only those (the others can never apply nor error).
    by_action: [PolicySet; 4],
    /// Entities of every request: none. An entity absent from the store has no attributes
    /// and no parents, exactly like the attribute-less principal and resource, and building
    /// an entity store per check (transitive closure) would cost ~5 µs.
    entities: Entities,
    authorizer: Authorizer,
    schema: Schema,
    meta: HashMap<PolicyId, Meta>,
    names: Names,
}

impl fmt::Debug for CedarPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CedarPolicy")
            .field("policies", &self.policy_ids())
            .finish_non_exhaustive()
    }
}

impl CedarPolicy {
    /// Loads and validates the policies of every file in `paths` (in order).
    ///
    /// # Errors
    /// [`GovError::Cedar`] naming the file: unreadable, a syntax error (with line:column), a
    /// schema validation error (policy id and message), an invalid annotation, a duplicate
    /// policy id, a policy template, or no policy at all in the whole set.
    pub fn from_files(paths: &[PathBuf]) -> Result<Self, GovError> {
        let mut builder = Builder::new()?;
        for path in paths {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| GovError::Cedar {
                origin: origin.clone(),
                message: format!("cannot read the policy file: {e}"),
            })?;
            builder.add(&origin, &text)?;
        }
        builder.finish(&paths_label(paths))
    }

    /// Loads and validates the policies in `text`; `origin` names it in errors and default
    /// policy ids (e.g. a file name, or `inline`).
    ///
    /// # Errors
    /// As [`CedarPolicy::from_files`], naming `origin`.
    pub fn from_source(origin: &str, text: &str) -> Result<Self, GovError> {
        let mut builder = Builder::new()?;
        builder.add(origin, text)?;
        builder.finish(origin)
    }

    /// Loads the files of `config` (relative paths resolved against `base_dir`), then its
    /// inline `source` (origin `inline`).
    ///
    /// # Errors
    /// As [`CedarPolicy::from_files`].
    pub fn from_config(config: &CedarConfig, base_dir: &Path) -> Result<Self, GovError> {
        let mut builder = Builder::new()?;
        let mut paths = Vec::with_capacity(config.files.len());
        for file in &config.files {
            let path = if file.is_absolute() {
                file.clone()
            } else {
                base_dir.join(file)
            };
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|e| GovError::Cedar {
                origin: origin.clone(),
                message: format!("cannot read the policy file: {e}"),
            })?;
            builder.add(&origin, &text)?;
            paths.push(path);
        }
        if let Some(source) = &config.source {
            builder.add("inline", source)?;
        }
        let mut label = paths_label(&paths);
        if config.source.is_some() {
            if !label.is_empty() {
                label.push_str(", ");
            }
            label.push_str("inline");
        }
        builder.finish(&label)
    }

    /// Ids of the loaded policies, in load order (`@id` annotation, else `<origin>:<index>`).
    pub fn policy_ids(&self) -> Vec<String> {
        let mut ids: Vec<(usize, String)> = self
            .meta
            .iter()
            .map(|(id, m)| (m.order, id.to_string()))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// The Cedar request (principal, action, resource, context) built for `subject`, and the
    /// entities it refers to.
    fn request(&self, subject: &Subject<'_>) -> Result<Request, GovError> {
        let action = subject.action();
        let names = &self.names;
        let agent = action.context.agent_id.as_deref().unwrap_or("anonymous");
        let principal = EntityUid::from_type_name_and_id(names.agent.clone(), EntityId::new(agent));
        let mut pairs = common_context(&action.context)?;
        let (action_uid, resource) = match &action.kind {
            ActionKind::Sql {
                database,
                sql,
                dialect,
            } => {
                sql_context(&mut pairs, subject, sql, dialect.as_str());
                (
                    names.sql.clone(),
                    EntityUid::from_type_name_and_id(
                        names.database.clone(),
                        EntityId::new(database),
                    ),
                )
            }
            ActionKind::ToolCall { name, arguments } => {
                let argument_names = match arguments {
                    serde_json::Value::Object(map) => map
                        .keys()
                        .map(|k| RestrictedExpression::new_string(k.clone()))
                        .collect(),
                    _ => Vec::new(),
                };
                let mut json = String::new();
                canonical_json(arguments, &mut json);
                pairs.push(string("arguments_json", json));
                pairs.push((
                    "argument_names".into(),
                    RestrictedExpression::new_set(argument_names),
                ));
                (
                    names.tool_call.clone(),
                    EntityUid::from_type_name_and_id(names.tool.clone(), EntityId::new(name)),
                )
            }
            ActionKind::Output { text } => {
                pairs.push(long("length", saturating(text.chars().count())));
                pairs.push(string("text", text.clone()));
                (
                    names.output.clone(),
                    EntityUid::from_type_name_and_id(
                        names.channel.clone(),
                        EntityId::new("output"),
                    ),
                )
            }
            ActionKind::Spend { usd, tokens } => {
                pairs.push(long("usd_micros", micros("usd", *usd)?));
                pairs.push(long("tokens", i64::try_from(*tokens).unwrap_or(i64::MAX)));
                (
                    names.spend.clone(),
                    EntityUid::from_type_name_and_id(names.budget.clone(), EntityId::new("run")),
                )
            }
        };
        let context = Context::from_pairs(pairs).map_err(|e| request_error(action, &e))?;
        Request::new(principal, action_uid, resource, context, None)
            .map_err(|e| request_error(action, &e))
    }

    /// Like [`CedarPolicy::request`], but also checks the request against the schema (used by
    /// tests to prove the built contexts conform).
    #[cfg(test)]
    fn validated_request(&self, subject: &Subject<'_>) -> Result<Request, String> {
        let request = self.request(subject).map_err(|e| e.to_string())?;
        let (Some(p), Some(a), Some(r), Some(c)) = (
            request.principal(),
            request.action(),
            request.resource(),
            request.context(),
        ) else {
            return Err("incomplete request".into());
        };
        Request::new(
            p.clone(),
            a.clone(),
            r.clone(),
            c.clone(),
            Some(&self.schema),
        )
        .map_err(|e| e.to_string())
    }

    fn finding(&self, id: &PolicyId) -> Finding {
        match self.meta.get(id) {
            Some(m) => Finding {
                severity: m.severity,
                reason: m.reason.clone(),
                effect: m.effect,
                rewrite: None,
                penalty: m.penalty,
                signal: None,
            },
            // Every policy in the set has metadata; this is only a defensive fallback.
            None => Finding::block(Severity::High, format!("forbidden by Cedar policy {id}")),
        }
    }

    /// The schema policies are validated against (parsed from [`CEDAR_SCHEMA`]).
    pub fn schema(&self) -> &Schema {
        &self.schema
    }
}

impl Policy for CedarPolicy {
    fn name(&self) -> &str {
        CEDAR_POLICY_NAME
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let request = self.request(subject)?;
        let policies = &self.by_action[action_index(&subject.action().kind)];
        let response = self
            .authorizer
            .is_authorized(&request, policies, &self.entities);
        let diagnostics = response.diagnostics();
        let mut errors = diagnostics.errors().peekable();
        if let Some(first) = errors.peek() {
            let cedar_policy::AuthorizationError::PolicyEvaluationError(first) = first;
            let origin = self
                .meta
                .get(first.policy_id())
                .map(|m| m.origin.clone())
                .unwrap_or_else(|| CEDAR_POLICY_NAME.into());
            let messages: Vec<String> = errors.map(|e| e.to_string()).collect();
            return Err(GovError::Cedar {
                origin,
                message: format!(
                    "evaluation error (Cedar would skip the policy; failing closed): {}",
                    messages.join("; ")
                ),
            });
        }
        if response.decision() == CedarDecision::Allow {
            return Ok(Vec::new());
        }
        let mut determining: Vec<(usize, &PolicyId)> = diagnostics
            .reason()
            .map(|id| (self.meta.get(id).map_or(usize::MAX, |m| m.order), id))
            .collect();
        if determining.is_empty() {
            return Ok(vec![Finding::block(Severity::High, DEFAULT_DENY_REASON)]);
        }
        determining.sort();
        Ok(determining
            .into_iter()
            .map(|(_, id)| self.finding(id))
            .collect())
    }
}

/// Accumulates policy sources into one validated policy set.
struct Builder {
    schema: Schema,
    validator: Validator,
    policies: PolicySet,
    meta: HashMap<PolicyId, Meta>,
}

impl Builder {
    fn new() -> Result<Self, GovError> {
        let (schema, _warnings) =
            Schema::from_cedarschema_str(CEDAR_SCHEMA).map_err(|e| GovError::Cedar {
                origin: SCHEMA_ORIGIN.into(),
                message: e.to_string(),
            })?;
        Ok(Builder {
            validator: Validator::new(schema.clone()),
            schema,
            policies: PolicySet::new(),
            meta: HashMap::new(),
        })
    }

    fn add(&mut self, origin: &str, text: &str) -> Result<(), GovError> {
        let err = |message: String| GovError::Cedar {
            origin: origin.to_string(),
            message,
        };
        let parsed = PolicySet::from_str(text).map_err(|e| {
            let messages: Vec<String> = e.iter().map(|pe| located(pe, text)).collect();
            err(format!("syntax error: {}", messages.join("; ")))
        })?;
        if let Some(t) = parsed.templates().next() {
            return Err(err(format!(
                "policy templates (with ?principal/?resource slots) are not supported: {}",
                t.id()
            )));
        }
        // `from_str` names the policies policy0, policy1, … in source order.
        let mut indexed: Vec<(usize, &cedar_policy::Policy)> = parsed
            .policies()
            .map(|p| {
                let index = p
                    .id()
                    .to_string()
                    .strip_prefix("policy")
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(usize::MAX);
                (index, p)
            })
            .collect();
        indexed.sort_by_key(|(i, _)| *i);
        let mut file_set = PolicySet::new();
        let mut file_meta = Vec::with_capacity(indexed.len());
        for (index, policy) in indexed {
            let id = match policy.annotation("id") {
                Some(id) if id.trim().is_empty() => {
                    return Err(err(format!(
                        "policy {index}: the @id annotation must not be empty"
                    )));
                }
                Some(id) => id.to_string(),
                None => format!("{origin}:{index}"),
            };
            let meta = meta_of(policy, &id, self.meta.len() + file_meta.len(), origin)
                .map_err(|m| err(format!("policy `{id}`: {m}")))?;
            let renamed = policy.new_id(PolicyId::new(&id));
            let earlier = match self.meta.get(renamed.id()) {
                Some(m) => Some(m.origin.as_str()),
                None => file_meta
                    .iter()
                    .any(|(known, _)| known == renamed.id())
                    .then_some(origin),
            };
            if let Some(earlier) = earlier {
                return Err(err(format!(
                    "duplicate policy id `{id}` (already loaded from `{earlier}`)"
                )));
            }
            file_set
                .add(renamed.clone())
                .map_err(|e| err(format!("policy `{id}`: {e}")))?;
            file_meta.push((renamed.id().clone(), meta));
        }
        let validation = self.validator.validate(&file_set, ValidationMode::Strict);
        if !validation.validation_passed() {
            let messages: Vec<String> = validation
                .validation_errors()
                .map(|e| {
                    let message = located(e, text);
                    let id = e.policy_id().to_string();
                    if message.contains(&format!("`{id}`")) {
                        message
                    } else {
                        format!("policy `{id}`: {message}")
                    }
                })
                .collect();
            return Err(err(format!(
                "schema validation failed: {}",
                messages.join("; ")
            )));
        }
        for policy in file_set.policies() {
            self.policies
                .add(policy.clone())
                .map_err(|e| err(format!("policy `{}`: {e}", policy.id())))?;
        }
        self.meta.extend(file_meta);
        Ok(())
    }

    fn finish(self, origin: &str) -> Result<CedarPolicy, GovError> {
        if self.meta.is_empty() {
            return Err(GovError::Cedar {
                origin: origin.to_string(),
                message: "no Cedar policies given: Cedar would deny every action".into(),
            });
        }
        let names = Names::new()?;
        let mut by_action: [PolicySet; 4] = Default::default();
        let actions = [&names.sql, &names.tool_call, &names.output, &names.spend];
        for policy in self.policies.policies() {
            for (set, uid) in by_action.iter_mut().zip(actions) {
                let applies = match policy.action_constraint() {
                    ActionConstraint::Any => true,
                    ActionConstraint::Eq(a) => a == *uid,
                    // the schema declares no action groups: `in` is equality
                    ActionConstraint::In(list) => list.contains(uid),
                };
                if applies {
                    set.add(policy.clone()).map_err(|e| GovError::Cedar {
                        origin: origin.to_string(),
                        message: format!("policy `{}`: {e}", policy.id()),
                    })?;
                }
            }
        }
        Ok(CedarPolicy {
            by_action,
            entities: Entities::empty(),
            authorizer: Authorizer::new(),
            schema: self.schema,
            meta: self.meta,
            names,
        })
    }
}

/// Reads the annotations of `policy` (see the module documentation).
fn meta_of(
    policy: &cedar_policy::Policy,
    id: &str,
    order: usize,
    origin: &str,
) -> Result<Meta, String> {
    let severity = match policy.annotation("severity") {
        Some(s) => Severity::from_str(s).map_err(|e| format!("@severity: {e}"))?,
        None => Severity::High,
    };
    let penalty = match policy.annotation("penalty") {
        Some(p) => {
            let value: f64 = p.trim().parse().map_err(|_| {
                format!("@penalty(\"{p}\") is not a number (expected e.g. @penalty(\"25\"))")
            })?;
            if !value.is_finite() || value < 0.0 {
                return Err(format!(
                    "@penalty(\"{p}\") must be a finite, non-negative number"
                ));
            }
            Some(value)
        }
        None => None,
    };
    let effect = match policy.annotation("effect").map(str::trim) {
        None => Effect::Block,
        Some(e) if e.eq_ignore_ascii_case("block") => Effect::Block,
        Some(e) if e.eq_ignore_ascii_case("warn") => Effect::Warn,
        Some(e) => {
            return Err(format!(
                "@effect(\"{e}\") is not one of block, warn (Cedar policies cannot rewrite)"
            ));
        }
    };
    let reason = match policy.annotation("reason") {
        Some(r) => r.to_string(),
        None => format!("forbidden by Cedar policy {id}"),
    };
    Ok(Meta {
        order,
        origin: origin.to_string(),
        severity,
        penalty,
        effect,
        reason,
    })
}

/// `error`'s message with the line:column of its first labelled span in `text`, if any.
fn located(error: &(impl miette::Diagnostic + fmt::Display), text: &str) -> String {
    let offset = error
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|l| l.offset());
    let mut message = error.to_string();
    if let Some(help) = error.help() {
        message.push_str(&format!(" ({help})"));
    }
    match offset {
        Some(offset) => {
            let (line, column) = line_column(text, offset);
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = text.get(..end).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

fn paths_label(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Index of `kind` in [`CedarPolicy::by_action`] (the order of the `Agl::Action` ids).
fn action_index(kind: &ActionKind) -> usize {
    match kind {
        ActionKind::Sql { .. } => 0,
        ActionKind::ToolCall { .. } => 1,
        ActionKind::Output { .. } => 2,
        ActionKind::Spend { .. } => 3,
    }
}

fn request_error(action: &Action, e: &impl fmt::Display) -> GovError {
    GovError::Cedar {
        origin: CEDAR_POLICY_NAME.into(),
        message: format!(
            "cannot build the Cedar request for a {} action: {e}",
            action.kind.type_name()
        ),
    }
}

fn string(key: &str, value: String) -> (String, RestrictedExpression) {
    (key.to_string(), RestrictedExpression::new_string(value))
}

fn long(key: &str, value: i64) -> (String, RestrictedExpression) {
    (key.to_string(), RestrictedExpression::new_long(value))
}

fn saturating(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `usd` in micro-USD, rounded; an error for amounts Cedar cannot represent (non-finite,
/// negative), so that a policy never sees a made-up value.
fn micros(field: &str, usd: f64) -> Result<i64, GovError> {
    if !usd.is_finite() || usd < 0.0 {
        return Err(GovError::Cedar {
            origin: CEDAR_POLICY_NAME.into(),
            message: format!(
                "`{field}` is {usd}: not a finite, non-negative USD amount, cannot authorise"
            ),
        });
    }
    // `as` saturates at i64::MAX for amounts above ~9.2e12 USD.
    Ok((usd * 1e6).round() as i64)
}

fn common_context(ctx: &ActionContext) -> Result<Vec<(String, RestrictedExpression)>, GovError> {
    let spend = |field: &str, usd: Option<f64>| match usd {
        Some(usd) => micros(field, usd),
        None => Ok(-1),
    };
    let mut pairs = Vec::with_capacity(10);
    pairs.push(string(
        "rollout_id",
        ctx.rollout_id.clone().unwrap_or_default(),
    ));
    pairs.push(long(
        "step",
        ctx.step
            .map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX)),
    ));
    pairs.push(long(
        "rollout_spend_micros",
        spend("context.rollout_spend_usd", ctx.rollout_spend_usd)?,
    ));
    pairs.push(long(
        "run_spend_micros",
        spend("context.run_spend_usd", ctx.run_spend_usd)?,
    ));
    Ok(pairs)
}

/// Writes `value` as compact JSON with the keys of every object sorted (byte order), so that
/// `arguments_json` does not depend on the order the agent wrote the keys in.
fn canonical_json(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(value, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Adds the SQL fields, from the parse cached in `subject`.
fn sql_context(
    pairs: &mut Vec<(String, RestrictedExpression)>,
    subject: &Subject<'_>,
    sql: &str,
    dialect: &str,
) {
    let statements = subject.sql().and_then(|p| p.statements().ok());
    let (kinds, tables, count) = match statements {
        Some(statements) => {
            let kinds: BTreeSet<String> = statement_kinds(statements)
                .iter()
                .map(|k| k.name().to_ascii_lowercase())
                .collect();
            (kinds, tables_of(statements), statements.len())
        }
        None => (BTreeSet::new(), BTreeSet::new(), 0),
    };
    let set = |values: BTreeSet<String>| {
        RestrictedExpression::new_set(values.into_iter().map(RestrictedExpression::new_string))
    };
    pairs.push(string("sql", sql.to_string()));
    pairs.push(string("dialect", dialect.to_string()));
    pairs.push(("statement_kinds".into(), set(kinds)));
    pairs.push(("tables".into(), set(tables)));
    pairs.push(long("statement_count", saturating(count)));
    pairs.push((
        "parse_error".into(),
        RestrictedExpression::new_bool(statements.is_none()),
    ));
}

/// Lowercase names of the tables `statements` read or write: whole and last part.
fn tables_of(statements: &[Statement]) -> BTreeSet<String> {
    let mut tables = BTreeSet::new();
    let mut add = |name: &sqlparser::ast::ObjectName| {
        tables.insert(display_name(name).to_lowercase());
        if let Some(last) = name_parts(name).last() {
            tables.insert(last.to_lowercase());
        }
    };
    for statement in statements {
        let _ = visit_relations(statement, |name| {
            add(name);
            ControlFlow::<()>::Continue(())
        });
        if let Statement::Drop {
            object_type: ObjectType::Table | ObjectType::View,
            names,
            ..
        } = statement
        {
            names.iter().for_each(&mut add);
        }
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::SqlDialect;

    const PERMIT_ALL: &str = "permit (principal, action, resource);";

    fn policy(text: &str) -> CedarPolicy {
        CedarPolicy::from_source("test.cedar", text).unwrap()
    }

    #[test]
    fn schema_parses_and_every_action_kind_builds_a_schema_valid_request() {
        let p = policy(PERMIT_ALL);
        let actions = [
            Action::sql("db", "SELECT * FROM main.Singer; DROP TABLE x"),
            Action::sql("db", "SELEC nonsense").with_dialect(SqlDialect::Mysql),
            Action::tool_call("send_email", serde_json::json!({"to": "a@b.c"})),
            Action::tool_call("t", serde_json::json!([1, 2])),
            Action::output("héllo"),
            Action::spend(0.25, 1000)
                .with_agent_id("a\"\0ü")
                .with_rollout_id("r")
                .with_step(3)
                .with_context(ActionContext {
                    rollout_spend_usd: Some(1.0),
                    run_spend_usd: Some(2.5),
                    ..ActionContext::default()
                }),
        ];
        for a in &actions {
            let subject = Subject::new(a);
            p.validated_request(&subject)
                .unwrap_or_else(|e| panic!("{a:?}: {e}"));
        }
    }

    #[test]
    fn tables_include_qualified_and_last_parts_and_drop_targets() {
        let parsed = crate::parse_sql(
            "SELECT * FROM main.Singer JOIN concert c ON 1; DROP TABLE Credentials; \
             INSERT INTO logs SELECT 1",
            SqlDialect::Sqlite,
        );
        let tables = tables_of(parsed.statements().unwrap());
        let got: Vec<&str> = tables.iter().map(String::as_str).collect();
        assert_eq!(
            got,
            vec!["concert", "credentials", "logs", "main.singer", "singer"]
        );
    }

    #[test]
    fn arguments_json_is_compact_with_sorted_keys_at_every_level() {
        let v = serde_json::json!({"to": "a\"b", "body": {"z": 1, "a": [true, null, 1.5]}});
        let mut out = String::new();
        canonical_json(&v, &mut out);
        assert_eq!(out, r#"{"body":{"a":[true,null,1.5],"z":1},"to":"a\"b"}"#);
    }

    #[test]
    fn line_column_counts_characters_and_clamps() {
        let text = "ab\ncü\nd";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 3), (2, 1));
        assert_eq!(line_column(text, 6), (2, 3)); // after 'ü' (2 bytes)
        assert_eq!(line_column(text, 5), (2, 2)); // inside 'ü': clamped back
        assert_eq!(line_column(text, 99), (3, 2));
    }

    #[test]
    fn micros_rounds_and_rejects_unrepresentable_amounts() {
        assert_eq!(micros("usd", 0.5).unwrap(), 500_000);
        assert_eq!(micros("usd", 0.000_000_4).unwrap(), 0);
        assert_eq!(micros("usd", 1e30).unwrap(), i64::MAX);
        for bad in [f64::NAN, f64::INFINITY, -0.01] {
            let e = micros("usd", bad).unwrap_err().to_string();
            assert!(e.contains("usd"), "{e}");
        }
    }
}
