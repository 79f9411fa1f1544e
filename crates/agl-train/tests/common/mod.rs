//! What the real-model tests share: the built-in model, pulled into the cache on first use (as
//! CI does before the tests).
#![allow(dead_code, clippy::unwrap_used)]

use agl_llm::{Engine, EngineConfig, ModelFiles, WeightFormat};
use candle_core::Device;

/// An engine over the dense SmolLM2-135M-Instruct; `None` (with a SKIP line) when the model
/// cannot be had here.
pub fn engine() -> Option<Engine> {
    let home = agl_llm::hub::agl_home();
    let path = match agl_llm::hub::ensure("smollm2-135m-instruct", &home) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("SKIP: the built-in model is unobtainable here: {e}");
            return None;
        }
    };
    let lm = agl_llm::load(&ModelFiles::Gguf(path), &Device::Cpu, WeightFormat::Dense).unwrap();
    Some(Engine::start(lm, EngineConfig::default()).unwrap())
}
