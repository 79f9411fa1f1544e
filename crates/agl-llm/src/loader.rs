//! Reads a model from disk into a [`LlamaModel`] plus its [`Tokenizer`] and [`ChatTemplate`]:
//! a llama-family GGUF file (llama.cpp's format; any GGML quantization candle reads) or a
//! Hugging Face model directory (`config.json`, `tokenizer.json`, `*.safetensors`).
//!
//! GGUF tensors are renamed to Hugging Face's names, and llama.cpp's interleaved q/k row order
//! (its converter permutes them for its rope kernel) is undone, so every model runs the same
//! rotate-half forward and LoRA adapters use PEFT's layout whatever the file format.
//!
//! Not responsible for finding or fetching files ([`crate::hub`]).

use std::collections::HashMap;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};

use crate::chat::ChatTemplate;
use crate::config::{Architecture, ModelConfig};
use crate::error::{LlmError, Result};
use crate::model::LlamaModel;
use crate::tokenizer::Tokenizer;

/// How to hold the linear weights in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// f32, dequantized at load (GGUF) or converted from f16/bf16 (safetensors): exact,
    /// trainable, and what the sampler and the trainer must share. The default.
    #[default]
    Dense,
    /// GGML Q8_0 blocks through candle's quantized kernels (GGUF Q8_0 tensors are kept,
    /// others re-quantized at load; safetensors are quantized): 3.8x less memory traffic per
    /// decoded token, for serving only. Activations are quantized as in llama.cpp, so the
    /// output follows llama.cpp's rather than the dense model's (on SmolLM2's Q4_1 file its
    /// greedy tokens equal llama.cpp's), and no gradient flows.
    Q8,
    /// Both: each linear weight as dense f32 and as Q8_0 blocks. Prompts prefill through the
    /// dense GEMM and decoding steps read the Q8_0 blocks, so prefill runs at dense speed
    /// (about 3x candle's Q8_0 kernel on this project's 2-core CPU) and decoding at Q8 speed,
    /// at the memory of both (Qwen2.5-Coder-1.5B: about 8.2 GB against 1.9 GB for Q8 and 6.5
    /// GB dense). Serving only; decoded tokens follow Q8's numbers, prompt positions dense's.
    Hybrid,
}

impl WeightFormat {
    /// Whether linear weights are kept as Q8_0 blocks.
    fn quantizes(self) -> bool {
        matches!(self, WeightFormat::Q8 | WeightFormat::Hybrid)
    }

    /// Whether linear weights are kept as dense f32.
    fn keeps_dense(self) -> bool {
        matches!(self, WeightFormat::Dense | WeightFormat::Hybrid)
    }
}

/// A model, its tokenizer and chat template, and where they came from.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// The forward pass.
    pub model: LlamaModel,
    /// The model's own tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template, if it has one.
    pub chat_template: Option<ChatTemplate>,
    /// The file or directory the model was read from.
    pub source: PathBuf,
}

/// Where a model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// One GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face model directory.
    HfDir(PathBuf),
}

/// The device named by `spec`: `cpu`, `cuda` / `cuda:N` (needs the `cuda` feature), or `auto`
/// (the first CUDA device when there is one, else the CPU).
pub fn device(spec: &str) -> Result<Device> {
    let cuda = |n: usize| {
        Device::new_cuda(n).map_err(|e| {
            LlmError::invalid(
                "device",
                format!("cannot open CUDA device {n}: {e} (build with `--features cuda`)"),
            )
        })
    };
    match spec {
        "cpu" => Ok(Device::Cpu),
        "auto" if candle_core::utils::cuda_is_available() => cuda(0),
        "auto" => Ok(Device::Cpu),
        "cuda" => cuda(0),
        s => match s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
        {
            Some(n) => cuda(n),
            None => Err(LlmError::invalid(
                "device",
                format!("`{s}` is not cpu, cuda, cuda:N or auto"),
            )),
        },
    }
}

/// Loads a model from `files` onto `device`.
pub fn load(files: &ModelFiles, device: &Device, format: WeightFormat) -> Result<LoadedModel> {
    match files {
        ModelFiles::Gguf(path) => load_gguf(path, device, format),
        ModelFiles::HfDir(dir) => load_hf_dir(dir, device, format),
    }
}

/// Loads a GGUF file.
pub fn load_gguf(path: &Path, device: &Device, format: WeightFormat) -> Result<LoadedModel> {
    let mut file = std::fs::File::open(path).map_err(|e| LlmError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| LlmError::io(path, e))?.len();
    let content = gguf_file::Content::read(&mut file)
        .map_err(|e| LlmError::model_file(path, format!("not a readable GGUF file: {e}")))?;
    check_gguf_extent(path, &content, file_len)?;
    let cfg = ModelConfig::from_gguf(path, &content)?;
    let tokenizer = Tokenizer::from_gguf(path, &content)?;
    let chat_template = ChatTemplate::from_gguf(path, &content)?;

    let mut dense = HashMap::new();
    let mut quantized = HashMap::new();
    let read = |file: &mut std::fs::File, name: &str| -> Result<QTensor> {
        content
            .tensor(file, name, device)
            .map_err(|e| LlmError::model_file(path, format!("tensor {name}: {e}")))
    };
    // The embedding lookup table is always f32; read once, it may also serve as the LM head.
    let token_embd = read(&mut file, "token_embd.weight")?;
    let embed = token_embd.dequantize(device)?;
    // A tied LM head's dense side (hybrid weights) is the embedding itself: shared storage.
    let tied_embed = cfg.tie_word_embeddings.then(|| embed.clone());
    dense.insert("model.embed_tokens.weight".to_string(), embed);
    let mut put =
        |hf: String, q: QTensor, permute_heads: Option<usize>, linear: bool| -> Result<()> {
            let keep_quantized = linear && format.quantizes();
            let mut keep_dense = !linear || format.keeps_dense();
            if let (true, "lm_head.weight", Some(embed)) = (keep_dense, hf.as_str(), &tied_embed) {
                dense.insert(hf.clone(), embed.clone());
                keep_dense = false;
            }
            if keep_quantized && permute_heads.is_none() && q.dtype() == GgmlDType::Q8_0 {
                if keep_dense {
                    dense.insert(hf.clone(), q.dequantize(device)?);
                }
                quantized.insert(hf, Arc::new(q));
                return Ok(());
            }
            let t = q.dequantize(device)?;
            let t = match permute_heads {
                Some(heads) => unpermute_rows(&t, heads)?,
                None => t,
            };
            if keep_quantized {
                quantized.insert(
                    hf.clone(),
                    Arc::new(QTensor::quantize(&t, GgmlDType::Q8_0)?),
                );
            }
            if keep_dense {
                dense.insert(hf, t);
            }
            Ok(())
        };
    // llama.cpp permutes q/k rows of llama models only (qwen2 uses its neox rope as is).
    let permuted = cfg.architecture == Architecture::Llama;
    if cfg.tie_word_embeddings && format.quantizes() {
        // The tied LM head reads the whole embedding per token: keep the file's blocks for it
        // too (llama.cpp multiplies by the quantized token_embd).
        put("lm_head.weight".into(), token_embd, None, true)?;
    }
    put(
        "model.norm.weight".into(),
        read(&mut file, "output_norm.weight")?,
        None,
        false,
    )?;
    if !cfg.tie_word_embeddings {
        put(
            "lm_head.weight".into(),
            read(&mut file, "output.weight")?,
            None,
            true,
        )?;
    }
    for i in 0..cfg.num_hidden_layers {
        let g = |s: &str| format!("blk.{i}.{s}");
        let h = |s: &str| format!("model.layers.{i}.{s}");
        put(
            h("input_layernorm.weight"),
            read(&mut file, &g("attn_norm.weight"))?,
            None,
            false,
        )?;
        put(
            h("post_attention_layernorm.weight"),
            read(&mut file, &g("ffn_norm.weight"))?,
            None,
            false,
        )?;
        let qh = permuted.then_some(cfg.num_attention_heads);
        let kh = permuted.then_some(cfg.num_key_value_heads);
        put(
            h("self_attn.q_proj.weight"),
            read(&mut file, &g("attn_q.weight"))?,
            qh,
            true,
        )?;
        put(
            h("self_attn.k_proj.weight"),
            read(&mut file, &g("attn_k.weight"))?,
            kh,
            true,
        )?;
        put(
            h("self_attn.v_proj.weight"),
            read(&mut file, &g("attn_v.weight"))?,
            None,
            true,
        )?;
        put(
            h("self_attn.o_proj.weight"),
            read(&mut file, &g("attn_output.weight"))?,
            None,
            true,
        )?;
        if cfg.attention_bias {
            put(
                h("self_attn.q_proj.bias"),
                read(&mut file, &g("attn_q.bias"))?,
                qh,
                false,
            )?;
            put(
                h("self_attn.k_proj.bias"),
                read(&mut file, &g("attn_k.bias"))?,
                kh,
                false,
            )?;
            put(
                h("self_attn.v_proj.bias"),
                read(&mut file, &g("attn_v.bias"))?,
                None,
                false,
            )?;
        }
        put(
            h("mlp.gate_proj.weight"),
            read(&mut file, &g("ffn_gate.weight"))?,
            None,
            true,
        )?;
        put(
            h("mlp.up_proj.weight"),
            read(&mut file, &g("ffn_up.weight"))?,
            None,
            true,
        )?;
        put(
            h("mlp.down_proj.weight"),
            read(&mut file, &g("ffn_down.weight"))?,
            None,
            true,
        )?;
    }
    let model = LlamaModel::from_weights(cfg, dense, quantized, device, path)?;
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template,
        source: path.to_path_buf(),
    })
}

/// Every tensor's data must lie inside the file: a truncated download is named as such
/// instead of failing later with an unexplained read error.
fn check_gguf_extent(path: &Path, content: &gguf_file::Content, file_len: u64) -> Result<()> {
    for (name, info) in &content.tensor_infos {
        let elems = info.shape.elem_count() as u64;
        let block = info.ggml_dtype.block_size() as u64;
        let bytes = elems.div_ceil(block.max(1)) * info.ggml_dtype.type_size() as u64;
        let end = content.tensor_data_offset + info.offset + bytes;
        if end > file_len {
            return Err(LlmError::model_file(
                path,
                format!(
                    "truncated: tensor {name} ends at byte {end}, the file has {file_len} bytes"
                ),
            ));
        }
    }
    Ok(())
}

/// Undoes llama.cpp's q/k row permutation: its converter maps Hugging Face's rotate-half head
/// layout to interleaved pairs with `w.reshape(heads, 2, hd/2, …).swapaxes(1, 2)`; this is the
/// inverse, for `[heads · hd, in]` weights and `[heads · hd]` biases.
fn unpermute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let out = dims[0];
    let hd = out / heads.max(1);
    let rest: usize = dims[1..].iter().product();
    let x = t
        .reshape((heads, hd / 2, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?;
    Ok(x.reshape(dims)?)
}

/// Loads a Hugging Face model directory (`config.json`, `tokenizer.json`, one or more
/// `*.safetensors`; weights in f32/f16/bf16 are converted to f32).
pub fn load_hf_dir(dir: &Path, device: &Device, format: WeightFormat) -> Result<LoadedModel> {
    let cfg = ModelConfig::from_hf_config(&dir.join("config.json"))?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let chat_template = ChatTemplate::from_dir(dir)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| LlmError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(LlmError::model_file(
            dir,
            "no *.safetensors weight files in the directory",
        ));
    }
    let mut dense = HashMap::new();
    let mut quantized = HashMap::new();
    for f in &files {
        check_safetensors_header(f)?;
        let tensors = candle_core::safetensors::load(f, device)
            .map_err(|e| LlmError::model_file(f, format!("cannot read safetensors: {e}")))?;
        for (name, t) in tensors {
            let t = t.to_dtype(DType::F32)?;
            let linear = name.ends_with("_proj.weight") || name == "lm_head.weight";
            if linear && format.quantizes() {
                quantized.insert(
                    name.clone(),
                    Arc::new(QTensor::quantize(&t, GgmlDType::Q8_0)?),
                );
            }
            if !linear || format.keeps_dense() {
                dense.insert(name, t);
            }
        }
    }
    let model = LlamaModel::from_weights(cfg, dense, quantized, device, dir)?;
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template,
        source: dir.to_path_buf(),
    })
}

/// A safetensors file starts with an 8-byte header length and a JSON header whose offsets must
/// fit the file: a truncated file is named as such.
fn check_safetensors_header(path: &Path) -> Result<()> {
    let mut f = std::fs::File::open(path).map_err(|e| LlmError::io(path, e))?;
    let len = f
        .seek(std::io::SeekFrom::End(0))
        .map_err(|e| LlmError::io(path, e))?;
    f.seek(std::io::SeekFrom::Start(0))
        .map_err(|e| LlmError::io(path, e))?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| LlmError::model_file(path, "truncated: shorter than a safetensors header"))?;
    let header_len = u64::from_le_bytes(n);
    if header_len > len.saturating_sub(8) || header_len > 100 << 20 {
        return Err(LlmError::model_file(
            path,
            "truncated or not a safetensors file (header length past the end)",
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header)
        .map_err(|e| LlmError::io(path, e))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| LlmError::model_file(path, format!("safetensors header is not JSON: {e}")))?;
    let data_len = len - 8 - header_len;
    if let Some(obj) = json.as_object() {
        for (name, info) in obj {
            let end = info
                .get("data_offsets")
                .and_then(|o| o.get(1))
                .and_then(|e| e.as_u64());
            if let Some(end) = end
                && end > data_len
            {
                return Err(LlmError::model_file(
                    path,
                    format!(
                        "truncated: tensor {name} ends at data byte {end}, the file has {data_len}"
                    ),
                ));
            }
        }
    }
    Ok(())
}
