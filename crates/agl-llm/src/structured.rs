//! Structured outputs: a grammar that constrains sampling, so the answer parses by
//! construction (OpenAI's `response_format` and `tool_choice: "required"` / a named function,
//! as vLLM serves them with its `guidance` backend).
//!
//! A [`Constraint`] travels in [`crate::SamplingParams::constraint`]. [`crate::Engine::submit`]
//! compiles it with [`llguidance`] against the model's vocabulary ([`GrammarCompiler`], built
//! once per engine on the first constrained request) into a [`ConstraintState`]; an invalid
//! schema or grammar is refused there, before anything runs, as
//! [`LlmError::InvalidRequest`] with `param = "constraint"`. Each row (each of the `n`
//! completions) then decodes with its own copy of the state: at every step the engine asks it
//! for the allowed tokens ([`ConstraintState::allowed_tokens`]), samples among them
//! ([`crate::sampling::sample_masked`]) and commits the token ([`ConstraintState::commit`]).
//! Rows without a constraint pay nothing. Once the grammar is complete only the model's
//! end-of-sequence tokens are allowed, so a constrained completion ends with one (finish reason
//! `stop`) unless `max_tokens`, a stop string or a stop token id ends it first.
//!
//! The log-probability reported for a sampled token stays the raw model's (the mask changes
//! which token is drawn, not what the model thought of it), and [`crate::TokenLogprob::forced`]
//! marks tokens the mask left no choice about, so a trainer can keep them out of the loss.
//!
//! # How the vocabulary is seen
//!
//! [`Vocabulary`] is llguidance's view of our [`Tokenizer`] (its `TokenizerEnv`): every id's
//! raw bytes ([`Tokenizer::token_bytes`]); special (control) tokens spelled as llguidance
//! expects, `0xFF` followed by their text (`\xFF<|im_end|>`), so grammar text never produces
//! them and a Lark grammar can name them (`<|im_end|>`); ids without a token, and ids past the
//! tokenizer up to the model's logits width (Qwen2.5 pads its embedding), as special
//! placeholders `\xFF<[id]>` that no grammar text reaches. User-defined added tokens that are
//! not special (`<tool_call>` in Qwen2.5) keep their text, so a grammar's literal
//! `"<tool_call>"` may be produced by that one token, as the model writes it (llguidance's
//! `toktrie_hf_tokenizers` instead marks every `<…>` added token special). The end-of-sequence
//! tokens are [`Tokenizer::eos_token_ids`], the same set that ends a row in the engine.
//!
//! # JSON style
//!
//! [`Constraint::JsonSchema`] and [`Constraint::JsonObject`] produce JSON without free
//! whitespace, separated as Python's `json.dumps` does (`{"a": 1, "b": [2, 3]}`): llguidance's
//! default (any amount of whitespace between tokens) lets a small model loop on newlines until
//! `max_tokens`. A schema that carries its own `"x-guidance"` options keeps them;
//! [`json_schema_with_defaults`] gives the same treatment to a schema embedded in a Lark
//! grammar's `%json { … }`.
//!
//! # Limits
//!
//! llguidance's [`ParserLimits`](llguidance::api::ParserLimits) bound the work a hostile grammar can cause: grammar size
//! (500 000 symbols), the lexer's fuel at compile time (1 000 000) and per mask (200 000),
//! Earley items per mask (50 000), lexer states (250 000). Past a limit at compile time the
//! request is refused with the limit named; past a limit while decoding, the request ends with
//! [`crate::Event::Error`] (see [`crate::engine`]). `$ref` may point inside the schema only
//! (`#/...`, `#/$defs/...`): nothing is fetched.
//!
//! Not responsible for turning OpenAI's request fields into a constraint (the API layer) or for
//! parsing the output (it is plain text that the grammar guarantees).

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use std::sync::Arc;

use crate::error::{LlmError, Result};
use crate::tokenizer::Tokenizer;

/// A grammar that every completion of a request must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON value valid against this JSON Schema (OpenAI's `json_schema` response format,
    /// a named tool's `parameters`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `json_object` response format).
    JsonObject,
    /// A grammar in llguidance's Lark syntax (may embed `%json { … }` schemas), e.g. a hermes
    /// `<tool_call>` whose body is one of the request's tools.
    Lark(String),
}

impl Constraint {
    /// The llguidance grammar of this constraint (JSON with the style of the module docs).
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(json_schema_with_defaults(schema))
            }
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(json_schema_with_defaults(&json!({
                    "type": "object"
                })))
            }
            Self::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        }
    }
}

/// `schema` with agl's JSON style (no free whitespace, `", "` between items, `": "` after
/// keys) unless it already has llguidance's `"x-guidance"` options. For a schema embedded in a
/// Lark grammar (`%json { … }`), so it writes JSON as [`Constraint::JsonSchema`] does.
pub fn json_schema_with_defaults(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        obj.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// llguidance's view of a [`Tokenizer`]: the token trie over the model's logits width (see the
/// module docs for how special and padding ids are spelled).
pub struct Vocabulary {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("vocab_size", &self.trie.vocab_size())
            .field("eos", &self.trie.eos_tokens())
            .finish()
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` over `vocab_size` ids (the model's logits width: ids the
    /// tokenizer lacks become special placeholders, ids past it are left out).
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] when no end-of-sequence id lies below `vocab_size` (a constrained
    /// completion could never end) or the vocabulary is empty.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self> {
        let n = u32::try_from(vocab_size)
            .map_err(|_| LlmError::Tokenizer(format!("{vocab_size} tokens is too many")))?;
        if n == 0 {
            return Err(LlmError::Tokenizer("the vocabulary is empty".into()));
        }
        let eos: Vec<u32> = tokenizer
            .eos_token_ids()
            .iter()
            .copied()
            .filter(|&t| t < n)
            .collect();
        let Some(&first_eos) = eos.first() else {
            return Err(LlmError::Tokenizer(
                "the model has no end-of-sequence token, so a constrained completion could not end"
                    .into(),
            ));
        };
        let special = tokenizer.special_token_ids();
        let words: Vec<Vec<u8>> = (0..n)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                let is_special = special.binary_search(&id).is_ok();
                if bytes.is_empty() {
                    placeholder(id)
                } else if is_special {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(&bytes);
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n, first_eos);
        info.tok_bos = tokenizer.bos_token_id().filter(|&t| t < n);
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        Ok(Self {
            trie,
            tokenizer: tokenizer.clone(),
        })
    }

    /// Number of ids (the model's logits width).
    pub fn vocab_size(&self) -> usize {
        self.trie.vocab_size()
    }

    /// The bytes llguidance sees for `id` (`0xFF` first for a special token or placeholder);
    /// empty outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.trie.token(id)
    }

    /// Whether llguidance treats `id` as special (no grammar text produces it).
    pub fn is_special(&self, id: u32) -> bool {
        self.trie.is_special_token(id)
    }

    /// The end-of-sequence ids, the first one llguidance's `tok_eos`.
    pub fn eos_token_ids(&self) -> &[u32] {
        self.trie.eos_tokens()
    }
}

fn placeholder(id: u32) -> Vec<u8> {
    let mut w = format!(".<[{id}]>").into_bytes();
    w[0] = TokTrie::SPECIAL_TOKEN_MARKER;
    w
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let n = self.trie.vocab_size() as u32;
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            match self.tokenizer.encode(text, false) {
                Ok(ids) if ids.iter().all(|&t| t < n) => ids,
                // A tokenizer failure, or an id past the model's logits: llguidance's own
                // longest-match tokenization over the trie.
                _ => self.trie.greedy_tokenize(text.as_bytes()),
            }
        })
    }
}

/// Compiles [`Constraint`]s against one model's vocabulary (llguidance's `ParserFactory`,
/// quiet, with [`ParserLimits`](llguidance::api::ParserLimits) as in the module docs). Built once per engine; `Send + Sync`.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .finish()
    }
}

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary over `vocab_size` ids (the model's logits width).
    ///
    /// # Errors
    /// As [`Vocabulary::new`]; [`LlmError::Tokenizer`] when llguidance refuses the vocabulary.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self> {
        let env: TokEnv = Arc::new(Vocabulary::new(tokenizer, vocab_size)?);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| LlmError::Tokenizer(format!("structured outputs: {e}")))?;
        factory.quiet();
        // Short errors: the verbose ones append the parser state and the whole grammar.
        factory.limits_mut().verbose_errors = false;
        Ok(Self { factory })
    }

    /// The vocabulary this compiler masks.
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Compiles `constraint` and computes its first mask (so a grammar that allows nothing, or
    /// that exceeds a limit at once, is refused here rather than while decoding).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] with `param = "constraint"` and llguidance's message: a
    /// schema or grammar that does not compile, exceeds a limit, or allows no first token.
    pub fn compile(&self, constraint: &Constraint) -> Result<ConstraintState> {
        let parser = self
            .factory
            .create_parser(constraint.grammar())
            .map_err(|e| invalid(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(&e));
        }
        let mut state = ConstraintState {
            matcher,
            eos: Arc::from(self.factory.tok_env().tok_trie().eos_tokens()),
            first: None,
        };
        let mut first = Vec::new();
        state.compute(&mut first).map_err(|e| invalid(&e))?;
        if first.is_empty() {
            return Err(invalid("the grammar allows no token at the start"));
        }
        state.first = Some(Arc::from(first));
        Ok(state)
    }
}

/// An [`LlmError::InvalidRequest`] for `constraint` from an llguidance message (trimmed, its
/// `<non-verbose/>` marker dropped, at most 2 000 characters).
fn invalid(message: &str) -> LlmError {
    let m = message.replace("<non-verbose/>", "");
    let m = m.trim();
    let m: String = if m.chars().count() > 2000 {
        m.chars().take(2000).chain("…".chars()).collect()
    } else {
        m.to_string()
    };
    LlmError::invalid("constraint", m)
}

/// The state of one row under a constraint: where in the grammar the tokens so far have led.
/// Cloning gives an independent state (one per completion of a request).
#[derive(Clone)]
pub struct ConstraintState {
    matcher: Matcher,
    eos: Arc<[u32]>,
    /// The first mask, computed at compile time, used by the first [`Self::allowed_tokens`].
    first: Option<Arc<[u32]>>,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl ConstraintState {
    /// Writes the ids allowed next into `out` (ascending; cleared first). Once the grammar is
    /// complete, only the end-of-sequence ids. Returns whether the constraint leaves no choice:
    /// one id allowed, or only end-of-sequence ids (any of them ends the row alike).
    ///
    /// # Errors
    /// [`LlmError::Generation`] with llguidance's message when computing the mask fails (a
    /// limit of the module docs exceeded, an internal error); the state is then unusable.
    pub fn allowed_tokens(&mut self, out: &mut Vec<u32>) -> Result<bool> {
        if let Some(first) = self.first.take() {
            out.clear();
            out.extend_from_slice(&first);
        } else {
            self.compute(out)
                .map_err(|e| LlmError::Generation(format!("constraint: {e}")))?;
        }
        Ok(out.len() == 1 || (!out.is_empty() && out.iter().all(|t| self.eos.contains(t))))
    }

    fn compute(&mut self, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        out.clear();
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| {
            e.to_string()
                .replace("<non-verbose/>", "")
                .trim()
                .to_string()
        })?;
        mask.iter_set_entries(|i| {
            if let Ok(t) = u32::try_from(i) {
                out.push(t);
            }
        });
        Ok(())
    }

    /// Advances the grammar by `token` (one of the ids [`Self::allowed_tokens`] returned).
    /// Nothing to do once the grammar is complete.
    ///
    /// # Errors
    /// [`LlmError::Generation`] when the grammar does not allow `token`.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.first = None;
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| {
            LlmError::Generation(format!(
                "constraint: {}",
                e.to_string().replace("<non-verbose/>", "").trim()
            ))
        })
    }

    /// Whether the grammar is complete (only end-of-sequence ids are allowed now).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A tiny byte-level `tokenizer.json` directory: ASCII letters, digits and punctuation one
    /// byte each, `Ġ` for space, two merges, and two special tokens.
    fn tiny() -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        let mut vocab = serde_json::Map::new();
        let mut id = 0u32;
        for c in (b'!'..=b'~').map(char::from).chain(['Ġ']) {
            vocab.insert(c.to_string(), id.into());
            id += 1;
        }
        for w in ["ab", "Ġa"] {
            vocab.insert(w.into(), id.into());
            id += 1;
        }
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": id, "content": "<|im_end|>", "special": true, "single_word": false,
                 "lstrip": false, "rstrip": false, "normalized": false},
                {"id": id + 1, "content": "<tool_call>", "special": false, "single_word": false,
                 "lstrip": false, "rstrip": false, "normalized": false}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                              "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": ["a b", "Ġ a"]}
        });
        std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token": "<|im_end|>"}"#,
        )
        .unwrap();
        Tokenizer::from_dir(dir.path()).unwrap()
    }

    #[test]
    fn token_bytes_round_trip_and_specials_are_marked() {
        let t = tiny();
        let n = t.vocab_size();
        let v = Vocabulary::new(&t, n + 3).unwrap();
        assert_eq!(v.vocab_size(), n + 3);
        for s in ["a", "ab", "Ġa", "~"] {
            let id = t.token_id(s).unwrap();
            assert_eq!(v.token_bytes(id), t.token_bytes(id).as_slice(), "{s}");
            assert!(!v.is_special(id));
        }
        assert_eq!(v.token_bytes(t.token_id("Ġa").unwrap()), b" a");
        let end = t.token_id("<|im_end|>").unwrap();
        assert!(v.is_special(end));
        assert_eq!(v.token_bytes(end), b"\xff<|im_end|>");
        assert_eq!(v.eos_token_ids(), &[end]);
        assert_eq!(v.tok_trie().get_special_token("<|im_end|>"), Some(end));
        // A user-defined added token is plain text.
        let call = t.token_id("<tool_call>").unwrap();
        assert!(!v.is_special(call));
        assert_eq!(v.token_bytes(call), b"<tool_call>");
        // Padding up to the logits width: special placeholders.
        assert!(v.is_special(n as u32 + 2));
        let mut pad = vec![0xff];
        pad.extend_from_slice(format!("<[{}]>", n + 2).as_bytes());
        assert_eq!(v.token_bytes(n as u32 + 2), pad.as_slice());
        // Tokenizing goes through our tokenizer.
        assert_eq!(v.tokenize("ab a"), t.encode("ab a", false).unwrap());
    }

    #[test]
    fn a_vocabulary_without_an_end_of_sequence_id_is_refused() {
        let t = tiny();
        // Cut below every id: the EOS (an added token past the byte tokens) is outside.
        let e = Vocabulary::new(&t, 10).unwrap_err();
        assert!(e.to_string().contains("end-of-sequence"), "{e}");
    }

    #[test]
    fn a_grammar_masks_and_ends_with_eos() {
        let t = tiny();
        let c = GrammarCompiler::new(&t, t.vocab_size()).unwrap();
        let mut s = c
            .compile(&Constraint::Lark(r#"start: "ab" ("a" | "b")"#.into()))
            .unwrap();
        let id = |x: &str| t.token_id(x).unwrap();
        let mut allowed = Vec::new();
        // Text the grammar forces comes as the tokenizer would write it: one choice.
        assert!(s.allowed_tokens(&mut allowed).unwrap());
        assert_eq!(allowed, vec![id("ab")]);
        s.commit(id("ab")).unwrap();
        assert!(!s.allowed_tokens(&mut allowed).unwrap());
        assert_eq!(allowed, vec![id("a"), id("b")]);
        s.commit(id("b")).unwrap();
        assert!(s.allowed_tokens(&mut allowed).unwrap());
        assert_eq!(allowed, vec![id("<|im_end|>")]);
        assert!(s.is_finished());
        s.commit(id("<|im_end|>")).unwrap();
    }

    #[test]
    fn bad_grammars_name_the_constraint() {
        let t = tiny();
        let c = GrammarCompiler::new(&t, t.vocab_size()).unwrap();
        for bad in [
            Constraint::JsonSchema(json!({"type": 5})),
            Constraint::Lark("start: ( \"a\"".into()),
            Constraint::Lark("start: foo".into()),
        ] {
            match c.compile(&bad) {
                Err(LlmError::InvalidRequest { param, message }) => {
                    assert_eq!(param, "constraint");
                    assert!(!message.is_empty() && !message.contains("non-verbose"));
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn json_defaults_are_added_once() {
        let s = json_schema_with_defaults(&json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], json!(false));
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(json_schema_with_defaults(&own), own);
        assert_eq!(json_schema_with_defaults(&json!(true)), json!(true));
    }
}
