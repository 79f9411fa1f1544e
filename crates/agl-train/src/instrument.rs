//! Agent Lightning's instrumentation for Rust agents: the emitters of `agentlightning.emitter`
//! (`emit_reward`, `emit_message`, `emit_object`, `emit_exception`) and its `operation`
//! context manager, as methods of [`StepContext`].
//!
//! Responsible for the shape of each span (§7 of the protocol reference, `AL:semconv.py`,
//! `AL:emitter/*.py`), so that Agent Lightning's readers and agl's ([`find_final_reward`],
//! [`crate::TracerTraceToTriplet`]) read them as they read Python's. Not responsible for
//! storing them: every emitter pushes an [`crate::Annotation`], which
//! [`crate::GovernedRunner::iter`] stores with the rollout when the step ends
//! ([`crate::GovernedRunner::step`] has no store and drops them), and not for the LLM calls'
//! spans (the gateway writes those).
//!
//! | emitter | span name | attributes | status |
//! |---|---|---|---|
//! | [`StepContext::emit_reward`], [`StepContext::emit_rewards`] | `agentlightning.annotation` | `agentlightning.reward.<i>.name` (str), `.value` (float); dimension 0 is the primary | OK |
//! | [`StepContext::emit_message`] | `agentlightning.message` | `agentlightning.message.body` (str) | UNSET |
//! | [`StepContext::emit_object`] | `agentlightning.object` | `agentlightning.object.type`; `.literal` (str) for a string, integer, float or bool (type `str`, `int`, `float`, `bool`), else `.json` (JSON text) and the Rust type's name | OK |
//! | [`StepContext::emit_exception`] | `agentlightning.exception` | `exception.type`, `exception.message`, `exception.escaped = false` | OK |
//! | [`StepContext::start_operation`] … [`StepContext::end_operation`] | `agentlightning.operation` | `agentlightning.operation.name`, `agentlightning.operation.input.<key>` and `agentlightning.operation.output` (JSON text), `agent.name` when given | OK; ERROR with `exception.*` from [`StepContext::fail_operation`] |
//!
//! Point spans (reward, message, object, exception) start and end at the moment they are
//! emitted, as Python's `create_span` does: the adapter's reward matching (`FIRST_OCCURRENCE`)
//! gives a reward to the last LLM call that ended before it, so the time matters. An operation
//! covers its start..end, and the LLM calls the gateway recorded inside that interval are
//! nested under it by the adapter's hierarchy repair: with `agent.name` set
//! ([`Operation::agent`], the first agent-name rule of `TracerTraceToTriplet`), an adapter with
//! `agent_match` keeps exactly the calls made inside the matching operations.
//!
//! # The rollout's reward
//! [`find_final_reward`] takes the last reward span in sequence order. The runner stores the
//! agent's spans first, then the governance annotation (no reward), then the
//! [`crate::PolicyReward`] span if the runner has one ([`crate::GovernedRunner::with_reward`]).
//! So: **without** a `PolicyReward`, the agent's last emitted reward is the rollout's reward;
//! **with** one, the shaped reward (`final`) is, and the agent's rewards stay in the trace as
//! earlier reward spans (which the triplet adapter gives to the LLM calls before them). To shape
//! the agent's own score, return it in the output and read it with
//! [`crate::PolicyReward::with_base_reward`].
//!
//! # Deliberate differences from Python
//! - a reward must be finite and have at least one dimension ([`TrainError::Emit`]); Python
//!   accepts NaN, which JSON cannot carry to the store;
//! - `emit_object` of a value that does not serialise is an error ([`TrainError::Emit`]), as in
//!   Python; an operation's input or output that does not serialise is recorded as
//!   `<not JSON: …>` (Python falls back to `str(obj)`);
//! - a float literal is Rust's shortest round-trip form (`0.1`, `1.0`, `1e20`; Python writes
//!   `1e+20`); both parse back to the same float;
//! - `exception.type` is the Rust type's name (`std::any::type_name`); there is no stack trace.
//!
//! # Example
//! ```
//! use agl_train::{Agent, AgentError, StepContext};
//!
//! struct Writer;
//!
//! #[async_trait::async_trait]
//! impl Agent for Writer {
//!     type Input = String;
//!     type Output = String;
//!     async fn run(&self, question: &String, ctx: &mut StepContext) -> Result<String, AgentError> {
//!         // LLM calls made between start and end are the `write` agent's.
//!         let op = ctx.start_operation("write").agent("write").input("question", question);
//!         let sql = String::from("SELECT 1"); // … call the model through ctx.llm_base_url(None) …
//!         ctx.end_operation(op.output(&sql));
//!         ctx.emit_message(format!("wrote {} characters", sql.len()));
//!         ctx.emit_reward(1.0)?;
//!         Ok(sql)
//!     }
//! }
//! ```

use std::any::type_name;
use std::error::Error;

use agl_core::{
    AttributeValue, Attributes, SpanStatus, StatusCode, now_seconds, reward_attributes, semconv,
};
use serde::Serialize;
use serde_json::Value;

#[cfg(doc)]
use agl_core::find_final_reward;

use crate::error::TrainError;
use crate::runner::{Annotation, StepContext};

/// The attribute that names the agent of an operation span: `agent.name`, the first rule of
/// the agent-name lookup of Agent Lightning's `TracerTraceToTriplet` (what its `agent_match`
/// is matched against).
pub const AGENT_NAME_ATTR: &str = "agent.name";

/// An operation in progress: started by [`StepContext::start_operation`], recorded as one
/// `agentlightning.operation` span by [`StepContext::end_operation`] or
/// [`StepContext::fail_operation`]. It holds no borrow of the context, so the agent keeps
/// using `ctx` (checks, LLM endpoints, other emitters) while it is open. Operations may nest
/// or overlap; each is its own span.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "an operation is recorded only when passed to StepContext::end_operation or fail_operation"]
pub struct Operation {
    start: f64,
    attributes: Attributes,
}

/// `value` as JSON text, or `<not JSON: …>` when it does not serialise.
fn json_text<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("<not JSON: {e}>"))
}

impl Operation {
    /// The operation's name (`agentlightning.operation.name`).
    pub fn name(&self) -> &str {
        self.attributes
            .get(semconv::OPERATION_NAME)
            .and_then(AttributeValue::as_str)
            .unwrap_or_default()
    }

    /// When it started, Unix seconds.
    pub fn start_time(&self) -> f64 {
        self.start
    }

    /// Names the agent whose LLM calls this operation encloses (`agent.name`, what a triplet
    /// adapter's `agent_match` selects).
    pub fn agent(mut self, name: impl Into<String>) -> Self {
        self.attributes
            .insert(AGENT_NAME_ATTR.into(), AttributeValue::Str(name.into()));
        self
    }

    /// Records one input, as Python's operation decorator records each argument:
    /// `agentlightning.operation.input.<key>` = `value` as JSON text.
    pub fn input<T: Serialize + ?Sized>(mut self, key: &str, value: &T) -> Self {
        self.attributes.insert(
            format!("{}.{key}", semconv::OPERATION_INPUT),
            AttributeValue::Str(json_text(value)),
        );
        self
    }

    /// Records the output (`agentlightning.operation.output`, JSON text); the last one given
    /// is kept.
    pub fn output<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.set_output(value);
        self
    }

    /// [`Operation::output`] in place.
    pub fn set_output<T: Serialize + ?Sized>(&mut self, value: &T) {
        self.attributes.insert(
            semconv::OPERATION_OUTPUT.into(),
            AttributeValue::Str(json_text(value)),
        );
    }

    /// Any other attribute of the span (Python's `operation(**attributes)`).
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<AttributeValue>) -> Self {
        self.attributes.insert(key.into(), value.into());
        self
    }
}

/// `exception.type`, `exception.message`, `exception.escaped`.
fn exception_attributes<E: Error + ?Sized>(error: &E, escaped: bool) -> Attributes {
    let mut a = Attributes::new();
    a.insert(semconv::EXCEPTION_TYPE.into(), type_name::<E>().into());
    a.insert(semconv::EXCEPTION_MESSAGE.into(), error.to_string().into());
    a.insert(semconv::EXCEPTION_ESCAPED.into(), escaped.into());
    a
}

impl StepContext {
    fn emit_point(&mut self, name: &str, attributes: Attributes, status: StatusCode) {
        let now = now_seconds();
        self.push_annotation(Annotation {
            name: name.to_string(),
            attributes,
            start_time: Some(now),
            end_time: Some(now),
            status: Some(SpanStatus::new(status)),
        });
    }

    /// Emits a reward (`agentlightning.emit_reward(value)`): an `agentlightning.annotation`
    /// span with `agentlightning.reward.0.name = "primary"` and `.0.value = value`. See the
    /// module docs for which reward becomes the rollout's.
    ///
    /// # Errors
    /// [`TrainError::Emit`] if `value` is not finite (nothing is recorded).
    pub fn emit_reward(&mut self, value: f64) -> Result<(), TrainError> {
        self.emit_rewards(&[("primary", value)])
    }

    /// Emits a multi-dimensional reward (`emit_reward({...}, primary_key=...)`): dimension `i`
    /// becomes `agentlightning.reward.<i>.name` / `.value`, in the order given, and the first
    /// is the primary (the value [`agl_core::get_reward_value`] reads).
    ///
    /// # Errors
    /// [`TrainError::Emit`] if `dims` is empty or a value is not finite (nothing is recorded).
    pub fn emit_rewards(&mut self, dims: &[(&str, f64)]) -> Result<(), TrainError> {
        if dims.is_empty() {
            return Err(TrainError::Emit(
                "a reward needs at least one dimension".into(),
            ));
        }
        if let Some((name, v)) = dims.iter().find(|(_, v)| !v.is_finite()) {
            return Err(TrainError::Emit(format!(
                "reward dimension `{name}` is {v}, not a finite number"
            )));
        }
        self.emit_point(
            semconv::AGL_ANNOTATION,
            reward_attributes(dims),
            StatusCode::Ok,
        );
        Ok(())
    }

    /// Emits a message (`emit_message`): an `agentlightning.message` span with
    /// `agentlightning.message.body` = `text`, status UNSET.
    pub fn emit_message(&mut self, text: impl Into<String>) {
        let mut a = Attributes::new();
        a.insert(
            semconv::MESSAGE_BODY.into(),
            AttributeValue::Str(text.into()),
        );
        self.emit_point(semconv::AGL_MESSAGE, a, StatusCode::Unset);
    }

    /// Emits an object (`emit_object`): an `agentlightning.object` span. A value that
    /// serialises to a JSON string, integer, float or bool is a literal
    /// (`agentlightning.object.type` = `str`, `int`, `float` or `bool`;
    /// `agentlightning.object.literal` = its text as Python's `str()` writes it: `True`,
    /// `False`, `3`, `0.5`); anything else (objects, arrays, `null`) is
    /// `agentlightning.object.json` (JSON text) with the Rust type's name as the type.
    ///
    /// # Errors
    /// [`TrainError::Emit`] if `value` does not serialise to JSON (nothing is recorded).
    pub fn emit_object<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), TrainError> {
        let json = serde_json::to_value(value)
            .map_err(|e| TrainError::Emit(format!("the object is not JSON-serialisable: {e}")))?;
        let literal = match &json {
            Value::String(s) => Some(("str", s.clone())),
            Value::Bool(b) => Some(("bool", if *b { "True" } else { "False" }.to_string())),
            Value::Number(n) if n.is_f64() => {
                Some(("float", format!("{:?}", n.as_f64().unwrap_or_default())))
            }
            Value::Number(n) => Some(("int", n.to_string())),
            _ => None,
        };
        let mut a = Attributes::new();
        match literal {
            Some((kind, text)) => {
                a.insert(semconv::OBJECT_TYPE.into(), kind.into());
                a.insert(semconv::OBJECT_LITERAL.into(), text.into());
            }
            None => {
                a.insert(semconv::OBJECT_TYPE.into(), type_name::<T>().into());
                a.insert(semconv::OBJECT_JSON.into(), json.to_string().into());
            }
        }
        self.emit_point(semconv::AGL_OBJECT, a, StatusCode::Ok);
        Ok(())
    }

    /// Emits an error the agent handled (`emit_exception`): an `agentlightning.exception`
    /// span with `exception.type` (the Rust type of `E`, e.g. `std::io::error::Error`; a
    /// `Box<dyn Error>` gives the box's type), `exception.message` (its `Display`) and
    /// `exception.escaped = false`, status OK (the span itself succeeded, as in Python).
    pub fn emit_exception<E: Error + ?Sized>(&mut self, error: &E) {
        self.emit_point(
            semconv::AGL_EXCEPTION,
            exception_attributes(error, false),
            StatusCode::Ok,
        );
    }

    /// Starts an operation named `name` (`agentlightning.operation.name`) now; give it an
    /// agent, inputs and an output with [`Operation`]'s builders, and record it with
    /// [`StepContext::end_operation`] or [`StepContext::fail_operation`]. An operation that is
    /// dropped is not recorded.
    pub fn start_operation(&self, name: impl Into<String>) -> Operation {
        let mut attributes = Attributes::new();
        attributes.insert(
            semconv::OPERATION_NAME.into(),
            AttributeValue::Str(name.into()),
        );
        Operation {
            start: now_seconds(),
            attributes,
        }
    }

    /// Ends `op` now and records it: an `agentlightning.operation` span from its start to now,
    /// status OK.
    pub fn end_operation(&mut self, op: Operation) {
        self.push_operation(op, SpanStatus::new(StatusCode::Ok));
    }

    /// Ends `op` now as failed by `error`, as Python's operation does when its block raises:
    /// status ERROR with the error's message as description, and `exception.type`,
    /// `exception.message`, `exception.escaped = true` on the span.
    pub fn fail_operation<E: Error + ?Sized>(&mut self, mut op: Operation, error: &E) {
        op.attributes.extend(exception_attributes(error, true));
        let status = SpanStatus {
            description: Some(error.to_string()),
            ..SpanStatus::new(StatusCode::Error)
        };
        self.push_operation(op, status);
    }

    fn push_operation(&mut self, op: Operation, status: SpanStatus) {
        let end = now_seconds().max(op.start);
        self.push_annotation(Annotation {
            name: semconv::AGL_OPERATION.to_string(),
            attributes: op.attributes,
            start_time: Some(op.start),
            end_time: Some(end),
            status: Some(status),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use agl_core::{EnqueueRolloutRequest, Span, find_final_reward, get_rewards_from_span};
    use agl_gov::Kernel;
    use agl_store::{InMemoryLightningStore, LightningStore};
    use serde_json::json;

    use super::*;
    use crate::reward::{PolicyReward, RewardConfig};
    use crate::runner::{Agent, AgentError, CancellationToken, GovernedRunner};
    use crate::tracer_adapter::{DEFAULT_LLM_CALL_MATCH, TracerTraceToTriplet};

    type Script = Box<dyn Fn(&mut StepContext) -> Result<Value, AgentError> + Send + Sync>;

    /// Runs a script on the step's context.
    struct Scripted(Script);

    #[async_trait::async_trait]
    impl Agent for Scripted {
        type Input = Value;
        type Output = Value;
        async fn run(&self, _input: &Value, ctx: &mut StepContext) -> Result<Value, AgentError> {
            (self.0)(ctx)
        }
    }

    fn kernel() -> Arc<Kernel> {
        Arc::new(Kernel::new(agl_gov::GovernanceMode::Enforce))
    }

    /// Runs `agent` on one rollout through `iter`; the attempt's spans in sequence order.
    async fn spans_of<A>(agent: A, reward: Option<Arc<PolicyReward<Value, Value>>>) -> Vec<Span>
    where
        A: Agent<Input = Value, Output = Value> + 'static,
    {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let queued = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!("q")))
            .await
            .unwrap();
        let mut r = GovernedRunner::new(kernel()).log_violations(false);
        if let Some(reward) = reward {
            r = r.with_reward(reward);
        }
        r.init(agent);
        r.init_worker("w", store.clone());
        assert_eq!(r.iter(&CancellationToken::new()).await.unwrap().rollouts, 1);
        store.list_spans(&queued.rollout_id, None).await.unwrap()
    }

    async fn run(script: Script) -> Vec<Span> {
        spans_of(Scripted(script), None).await
    }

    fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
        spans.iter().filter(|s| s.name == name).collect()
    }

    fn text<'a>(span: &'a Span, key: &str) -> &'a str {
        span.attributes
            .get(key)
            .and_then(AttributeValue::as_str)
            .unwrap_or_else(|| panic!("no string {key} in {:?}", span.attributes))
    }

    #[tokio::test]
    async fn an_emitted_reward_is_the_rollouts_final_reward_without_a_policy_reward() {
        let spans = run(Box::new(|ctx| {
            ctx.emit_reward(0.25)?;
            ctx.emit_reward(0.75)?;
            Ok(json!(null))
        }))
        .await;
        let rewards: Vec<_> = spans.iter().filter_map(get_rewards_from_span).collect();
        assert_eq!(rewards.len(), 2, "{spans:#?}");
        assert_eq!(rewards[1][0].name, "primary");
        let reward_span = named(&spans, semconv::AGL_ANNOTATION)[1];
        assert_eq!(reward_span.status.status_code, StatusCode::Ok);
        // Stamped when emitted, before the runner wrote its governance span.
        let governance = spans.last().unwrap();
        assert!(reward_span.start_time <= governance.start_time);
        assert_eq!(find_final_reward(&spans), Some(0.75));
    }

    #[tokio::test]
    async fn with_a_policy_reward_the_shaped_reward_is_final_and_the_agents_stays() {
        let reward = Arc::new(PolicyReward::new(RewardConfig::default()));
        let spans = spans_of(
            Scripted(Box::new(|ctx| {
                ctx.emit_reward(0.5)?;
                Ok(json!(null))
            })),
            Some(reward),
        )
        .await;
        let values: Vec<_> = spans
            .iter()
            .filter_map(agl_core::get_reward_value)
            .collect();
        // The agent's 0.5, then the shaper's `final` (success 1.0 + clean bonus 5.0).
        assert_eq!(values, [0.5, 6.0]);
        assert_eq!(find_final_reward(&spans), Some(6.0));
    }

    #[tokio::test]
    async fn multi_dimensional_rewards_keep_their_order_and_bad_ones_are_refused() {
        let spans = run(Box::new(|ctx| {
            ctx.emit_rewards(&[("final", -99.0), ("base", 1.0), ("policy_penalty", -100.0)])?;
            assert!(matches!(ctx.emit_rewards(&[]), Err(TrainError::Emit(_))));
            assert!(matches!(
                ctx.emit_rewards(&[("a", 1.0), ("b", f64::NAN)]),
                Err(TrainError::Emit(_))
            ));
            assert!(matches!(
                ctx.emit_reward(f64::INFINITY),
                Err(TrainError::Emit(_))
            ));
            Ok(json!(null))
        }))
        .await;
        let dims: Vec<_> = spans.iter().filter_map(get_rewards_from_span).collect();
        assert_eq!(dims.len(), 1, "refused rewards are not recorded");
        let got: Vec<_> = dims[0].iter().map(|d| (d.name.as_str(), d.value)).collect();
        assert_eq!(
            got,
            [("final", -99.0), ("base", 1.0), ("policy_penalty", -100.0)]
        );
        assert_eq!(find_final_reward(&spans), Some(-99.0));
    }

    #[tokio::test]
    async fn messages_objects_and_exceptions_have_agent_lightnings_shapes() {
        #[derive(Serialize)]
        struct Plan {
            steps: Vec<&'static str>,
        }
        let spans = run(Box::new(|ctx| {
            ctx.emit_message("thinking");
            ctx.emit_object("text")?;
            ctx.emit_object(&3)?;
            ctx.emit_object(&0.5)?;
            ctx.emit_object(&1.0)?;
            ctx.emit_object(&true)?;
            ctx.emit_object(&Plan {
                steps: vec!["a", "b"],
            })?;
            let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
            assert!(matches!(ctx.emit_object(&bad), Err(TrainError::Emit(_))));
            let err = std::io::Error::new(std::io::ErrorKind::NotFound, "no such table");
            ctx.emit_exception(&err);
            Ok(json!(null))
        }))
        .await;

        let message = named(&spans, semconv::AGL_MESSAGE);
        assert_eq!(message.len(), 1);
        assert_eq!(text(message[0], semconv::MESSAGE_BODY), "thinking");
        assert_eq!(message[0].status.status_code, StatusCode::Unset);

        let objects: Vec<_> = named(&spans, semconv::AGL_OBJECT)
            .into_iter()
            .map(|s| {
                (
                    text(s, semconv::OBJECT_TYPE).to_string(),
                    s.attributes
                        .get(semconv::OBJECT_LITERAL)
                        .or_else(|| s.attributes.get(semconv::OBJECT_JSON))
                        .and_then(AttributeValue::as_str)
                        .unwrap()
                        .to_string(),
                    s.attributes.contains_key(semconv::OBJECT_JSON),
                )
            })
            .collect();
        let o = |t: &str, v: &str, json: bool| (t.to_string(), v.to_string(), json);
        assert_eq!(
            objects,
            [
                o("str", "text", false),
                o("int", "3", false),
                o("float", "0.5", false),
                o("float", "1.0", false),
                o("bool", "True", false),
                o(type_name::<Plan>(), r#"{"steps":["a","b"]}"#, true),
            ]
        );

        let exception = named(&spans, semconv::AGL_EXCEPTION);
        assert_eq!(exception.len(), 1);
        let e = exception[0];
        assert_eq!(text(e, semconv::EXCEPTION_TYPE), "std::io::error::Error");
        assert_eq!(text(e, semconv::EXCEPTION_MESSAGE), "no such table");
        assert_eq!(
            e.attributes.get(semconv::EXCEPTION_ESCAPED),
            Some(&AttributeValue::Bool(false))
        );
        assert_eq!(e.status.status_code, StatusCode::Ok);
    }

    #[tokio::test]
    async fn an_operation_span_covers_its_interval_with_name_agent_input_and_output() {
        let spans = run(Box::new(|ctx| {
            let op = ctx
                .start_operation("write")
                .agent("writer")
                .input("question", "how many singers?")
                .input("turn", &1)
                .attribute("custom", 7_i64);
            assert_eq!(op.name(), "write");
            std::thread::sleep(Duration::from_millis(5));
            ctx.emit_message("inside");
            std::thread::sleep(Duration::from_millis(5));
            ctx.end_operation(op.output(&json!({"sql": "SELECT 1"})));

            let op = ctx.start_operation("check");
            let err = std::io::Error::other("the database is locked");
            ctx.fail_operation(op, &err);
            Ok(json!(null))
        }))
        .await;
        let ops = named(&spans, semconv::AGL_OPERATION);
        assert_eq!(ops.len(), 2);
        let write = ops[0];
        assert_eq!(text(write, semconv::OPERATION_NAME), "write");
        assert_eq!(text(write, AGENT_NAME_ATTR), "writer");
        assert_eq!(
            text(write, "agentlightning.operation.input.question"),
            r#""how many singers?""#
        );
        assert_eq!(text(write, "agentlightning.operation.input.turn"), "1");
        assert_eq!(
            text(write, semconv::OPERATION_OUTPUT),
            r#"{"sql":"SELECT 1"}"#
        );
        assert_eq!(
            write.attributes.get("custom"),
            Some(&AttributeValue::Int(7))
        );
        assert_eq!(write.status.status_code, StatusCode::Ok);
        let inside = named(&spans, semconv::AGL_MESSAGE)[0];
        let (start, end) = (write.start_time.unwrap(), write.end_time.unwrap());
        let at = inside.start_time.unwrap();
        assert!(start < at && at < end, "{start} < {at} < {end}");
        assert!(end - start >= 0.009, "{start}..{end}");

        let check = ops[1];
        assert_eq!(check.status.status_code, StatusCode::Error);
        assert_eq!(
            check.status.description.as_deref(),
            Some("the database is locked")
        );
        assert_eq!(
            text(check, semconv::EXCEPTION_MESSAGE),
            "the database is locked"
        );
        assert_eq!(
            check.attributes.get(semconv::EXCEPTION_ESCAPED),
            Some(&AttributeValue::Bool(true))
        );
    }

    /// Makes one "LLM call" (a gateway-shaped span written straight to the store, with token
    /// ids and response id `r-<role>`) inside an operation per role, then emits a reward.
    struct CallsInsideOperations(Arc<dyn LightningStore>);

    #[async_trait::async_trait]
    impl Agent for CallsInsideOperations {
        type Input = Value;
        type Output = Value;
        async fn run(&self, _input: &Value, ctx: &mut StepContext) -> Result<Value, AgentError> {
            let rid = ctx.rollout_id().unwrap().to_string();
            let aid = ctx.attempt_id().unwrap().to_string();
            let pause = || tokio::time::sleep(Duration::from_millis(3));
            for role in ["write", "check"] {
                let op = ctx.start_operation(role).agent(role);
                pause().await;
                let start = now_seconds();
                pause().await;
                let seq = self.0.get_next_span_sequence_id(&rid, &aid).await?;
                let mut attrs = Attributes::new();
                attrs.insert(
                    semconv::gen_ai::RESPONSE_ID.into(),
                    format!("r-{role}").into(),
                );
                attrs.insert(
                    "prompt_token_ids".into(),
                    AttributeValue::IntArray(vec![1, 2]),
                );
                attrs.insert(
                    "response_token_ids".into(),
                    AttributeValue::IntArray(vec![3]),
                );
                let mut call = Span::new(&rid, &aid, seq, semconv::OPENAI_CHAT_COMPLETION, attrs);
                call.start_time = Some(start);
                call.end_time = Some(now_seconds());
                self.0.add_spans(vec![call]).await?;
                pause().await;
                ctx.end_operation(op.output("done"));
                pause().await;
            }
            ctx.emit_reward(1.0)?;
            Ok(json!(null))
        }
    }

    #[tokio::test]
    async fn the_triplet_adapter_selects_the_calls_inside_a_named_operation() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let queued = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!("q")))
            .await
            .unwrap();
        let mut r = GovernedRunner::new(kernel()).log_violations(false);
        r.init(CallsInsideOperations(store.clone()));
        r.init_worker("w", store.clone());
        r.iter(&CancellationToken::new()).await.unwrap();
        let spans = store.list_spans(&queued.rollout_id, None).await.unwrap();

        let ids = |agent_match: Option<&str>| -> Vec<(String, Option<f64>, Value)> {
            TracerTraceToTriplet::new(DEFAULT_LLM_CALL_MATCH, agent_match)
                .unwrap()
                .adapt(&spans)
                .unwrap()
                .into_iter()
                .map(|t| {
                    (
                        t.metadata["response_id"].as_str().unwrap().to_string(),
                        t.reward,
                        t.metadata["agent_name"].clone(),
                    )
                })
                .collect()
        };
        // Every call, each named by the operation around it; the reward, emitted after the
        // `check` call, goes to that call (FIRST_OCCURRENCE).
        assert_eq!(
            ids(None),
            [
                ("r-write".to_string(), None, json!("write")),
                ("r-check".to_string(), Some(1.0), json!("check")),
            ]
        );
        // Only `write` calls: the reward goes to the last selected call before it.
        assert_eq!(
            ids(Some("write")),
            [("r-write".to_string(), Some(1.0), json!("write"))]
        );
        assert_eq!(
            ids(Some("check")),
            [("r-check".to_string(), Some(1.0), json!("check"))]
        );
        assert_eq!(find_final_reward(&spans), Some(1.0));
    }
}
