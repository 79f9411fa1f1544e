//! Starting the engine from a plain description of what to serve: resolve the model (a known
//! name, a `.gguf` file or a Hugging Face model directory), pick the device, load the weights,
//! start the [`Engine`] under its served name and load the start-up LoRA adapters.
//!
//! Used by every `agl` command that runs the built-in engine (`agl llm serve`, `agl store
//! --llm`, `agl eval`, `agl train --agent llm`, `agl bench gateway`). Not for parsing command
//! lines (the binary maps its flags onto an [`EngineSpec`]) or printing: progress is reported
//! through [`StartupEvent`]s. The error messages name the flags of `agl` that the spec's fields
//! come from (`--model`, `--adapter`, `--max-batch-rows`), since that is where a user fixes them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::api::{self, ApiOptions};
use crate::{Engine, EngineConfig, LlmError, Result, WeightFormat};

/// What to start: the fields of the `--model`, `--weights`, `--device`, `--adapter`,
/// `--served-model-name` and `--max-batch-rows` flags.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    /// A known model name (see [`crate::hub`]), a `.gguf` file or a Hugging Face model
    /// directory.
    pub model: String,
    /// How the linear weights are held.
    pub weights: WeightFormat,
    /// Where the model runs: `cpu`, `cuda`, `cuda:N` or `auto` ([`crate::loader::device`]).
    pub device: String,
    /// LoRA adapters to serve from the start, each `NAME=DIR` (a PEFT adapter directory).
    pub adapters: Vec<String>,
    /// The base model's name in the API; `None`: [`default_served_name`] of `model`.
    pub served_model_name: Option<String>,
    /// Most completions decoded in one batch step (at least 1).
    pub max_batch_rows: usize,
    /// Budget of the engine's prefix cache in prompt positions (0: off;
    /// [`EngineConfig::prefix_cache_tokens`]).
    pub prefix_cache_tokens: usize,
}

/// Progress of [`start_engine`], for the caller to show.
#[derive(Debug, Clone, Copy)]
pub enum StartupEvent<'a> {
    /// The model is loaded and the engine started.
    Loaded {
        /// The model's source file or directory.
        source: &'a str,
        /// The base model's name in the API.
        name: &'a str,
        /// Seconds from resolving the device to the engine's start.
        seconds: f64,
    },
    /// A start-up adapter is loaded.
    Adapter {
        /// Its name in the API.
        name: &'a str,
        /// Its directory.
        dir: &'a Path,
    },
}

/// A started engine and what the API shows about it.
pub struct StartedEngine {
    /// The engine.
    pub engine: Engine,
    /// The base model's name in the API.
    pub name: String,
    /// The model's source file or directory.
    pub source: String,
    /// Adapter name → directory.
    pub adapter_roots: HashMap<String, String>,
}

impl StartedEngine {
    /// The engine's OpenAI-compatible router (no API key: for in-process use).
    pub fn router(&self) -> axum::Router {
        api::router(self.engine.clone(), self.options(None))
    }

    /// API options showing this engine's model and adapters.
    pub fn options(&self, api_key: Option<String>) -> ApiOptions {
        ApiOptions {
            api_key,
            model_root: Some(self.source.clone()),
            adapter_roots: self.adapter_roots.clone(),
            ..ApiOptions::default()
        }
    }
}

/// Wraps `source` with the step of the start-up that failed.
fn during(step: impl Into<String>) -> impl FnOnce(LlmError) -> LlmError {
    move |source| LlmError::Startup {
        step: step.into(),
        source: Box::new(source),
    }
}

/// Loads the model of `spec` and its adapters and starts the engine, reporting progress to
/// `on_event` (once [`StartupEvent::Loaded`], then one [`StartupEvent::Adapter`] per adapter).
///
/// # Errors
/// [`LlmError::InvalidSpec`] for a zero `max_batch_rows` or an adapter that is not
/// `NAME=DIR`; [`LlmError::Startup`] naming the step (resolving the model, loading it,
/// starting the engine, loading an adapter) around the error of that step; the device's own
/// error for an unusable `device`.
pub fn start_engine(
    spec: &EngineSpec,
    mut on_event: impl FnMut(StartupEvent<'_>),
) -> Result<StartedEngine> {
    if spec.max_batch_rows == 0 {
        return Err(LlmError::InvalidSpec(
            "--max-batch-rows must be at least 1".into(),
        ));
    }
    let adapters = spec
        .adapters
        .iter()
        .map(|s| parse_adapter(s))
        .collect::<Result<Vec<_>>>()?;
    let files = crate::hub::resolve(&spec.model, &crate::hub::agl_home())
        .map_err(during(format!("resolving --model {}", spec.model)))?;
    let t0 = Instant::now();
    let device = crate::loader::device(&spec.device)?;
    let loaded = crate::load(&files, &device, spec.weights).map_err(during("loading the model"))?;
    let source = loaded.source.display().to_string();
    let name = spec
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_served_name(&spec.model));
    let engine = Engine::start(
        loaded,
        EngineConfig {
            model_name: name.clone(),
            max_batch_rows: spec.max_batch_rows,
            prefix_cache_tokens: spec.prefix_cache_tokens,
        },
    )
    .map_err(during("starting the engine"))?;
    on_event(StartupEvent::Loaded {
        source: &source,
        name: &name,
        seconds: t0.elapsed().as_secs_f64(),
    });
    let mut adapter_roots = HashMap::new();
    for (adapter, dir) in &adapters {
        engine.load_adapter(adapter, dir).map_err(during(format!(
            "loading adapter `{adapter}` from {}",
            dir.display()
        )))?;
        adapter_roots.insert(adapter.clone(), dir.display().to_string());
        on_event(StartupEvent::Adapter { name: adapter, dir });
    }
    Ok(StartedEngine {
        engine,
        name,
        source,
        adapter_roots,
    })
}

/// The served name for `--model SPEC` when `--served-model-name` is absent: the file's stem or
/// the directory's name when `spec` is a path that exists, else `spec` itself.
pub fn default_served_name(spec: &str) -> String {
    let path = Path::new(spec);
    if path.exists() {
        let stem = if path.is_dir() {
            path.file_name()
        } else {
            path.file_stem()
        };
        if let Some(s) = stem.and_then(|s| s.to_str()).filter(|s| !s.is_empty()) {
            return s.to_string();
        }
    }
    spec.to_string()
}

/// Splits an adapter spec `NAME=DIR` (both trimmed, neither empty).
///
/// # Errors
/// [`LlmError::InvalidSpec`] naming the spec when it has no `=` or an empty side.
pub fn parse_adapter(spec: &str) -> Result<(String, PathBuf)> {
    match spec.split_once('=') {
        Some((name, dir)) if !name.trim().is_empty() && !dir.trim().is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(dir.trim())))
        }
        _ => Err(LlmError::InvalidSpec(format!(
            "--adapter `{spec}`: expected NAME=DIR"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model: &str) -> EngineSpec {
        EngineSpec {
            model: model.into(),
            weights: WeightFormat::Dense,
            device: "cpu".into(),
            adapters: Vec::new(),
            served_model_name: None,
            max_batch_rows: 8,
            prefix_cache_tokens: 0,
        }
    }

    #[test]
    fn adapters_are_name_equals_dir() {
        assert_eq!(
            parse_adapter(" a = /x/y ").ok(),
            Some(("a".to_string(), PathBuf::from("/x/y")))
        );
        for bad in ["a", "=dir", "a=", " = "] {
            let e = parse_adapter(bad).err().map(|e| e.to_string());
            assert_eq!(e, Some(format!("--adapter `{bad}`: expected NAME=DIR")));
        }
    }

    #[test]
    fn the_served_name_is_the_stem_of_an_existing_path_else_the_spec() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| LlmError::io("tempdir", e))?;
        let file = dir.path().join("model-q8.gguf");
        std::fs::write(&file, b"").map_err(|e| LlmError::io(&file, e))?;
        assert_eq!(default_served_name(&file.display().to_string()), "model-q8");
        let sub = dir.path().join("SmolLM2");
        std::fs::create_dir(&sub).map_err(|e| LlmError::io(&sub, e))?;
        assert_eq!(default_served_name(&sub.display().to_string()), "SmolLM2");
        assert_eq!(
            default_served_name("smollm2-135m-instruct"),
            "smollm2-135m-instruct"
        );
        Ok(())
    }

    #[test]
    fn bad_specs_fail_before_anything_is_loaded_with_the_flag_named() {
        let zero = EngineSpec {
            max_batch_rows: 0,
            ..spec("smollm2-135m-instruct")
        };
        let e = start_engine(&zero, |_| {}).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("--max-batch-rows must be at least 1"));

        let bad_adapter = EngineSpec {
            adapters: vec!["nodir".into()],
            ..spec("/no/such/model.gguf")
        };
        let e = start_engine(&bad_adapter, |_| {})
            .err()
            .map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("--adapter `nodir`: expected NAME=DIR"));
    }

    #[test]
    fn an_unknown_model_names_the_step_and_keeps_the_cause() {
        let e = start_engine(&spec("/no/such/model.gguf"), |_| {}).err();
        let Some(e) = e else {
            panic!("a missing model started");
        };
        assert_eq!(e.to_string(), "resolving --model /no/such/model.gguf");
        let cause = std::error::Error::source(&e).map(|c| c.to_string());
        assert!(
            cause.is_some_and(|c| c.contains("/no/such/model.gguf")),
            "{e:?}"
        );
    }
}
