//! The engine's prefix cache: the keys and values of recently prefilled prompts, reused when a
//! new request's prompt starts with the same tokens under the same adapter (vLLM's automatic
//! prefix caching, kept per prompt rather than per block).
//!
//! Agents repeat themselves: a GRPO group is the same prompt sent G times by G runners, an
//! agent's next turn is its last prompt plus the answer and a new message, and the questions
//! of one database share the system message and the schema. The prefill of a 300-token prompt
//! is most of the work of a 30-token answer on a CPU, so a request takes the longest prefix
//! any cached prompt shares with it, copies those positions, and prefills only the rest.
//!
//! Keys and values of a position depend only on the tokens up to it (causal attention) and on
//! the weights, so a reused prefix is the same computation. The engine prefills in chunks
//! aligned at position 0 and reuses only whole chunks ([`super::PREFILL_CHUNK`]), so it is
//! also the same arithmetic: outputs are bit-identical with and without the cache (tested in
//! `tests/model.rs`). Entries are bound to the adapter object they were computed with: an
//! adapter replaced under the same name never reuses the old one's entries.
//!
//! Entries are kept most recently used first; past the budget (positions, over all entries)
//! the least recently used go. One position costs `layers · 2 · kv_heads · head_dim · 4`
//! bytes: 57,344 for Qwen2.5-1.5B, 46,080 for SmolLM2-135M.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::error::Result;
use crate::lora::LoraAdapter;
use crate::model::KvCache;

/// Default budget of the prefix cache, in positions (about 235 MB for Qwen2.5-1.5B).
pub const DEFAULT_PREFIX_CACHE_TOKENS: usize = 4096;

/// One prefilled prompt.
struct Entry {
    adapter: Option<Arc<LoraAdapter>>,
    tokens: Vec<u32>,
    cache: KvCache,
}

impl Entry {
    fn serves(&self, adapter: Option<&Arc<LoraAdapter>>) -> bool {
        match (&self.adapter, adapter) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Recently prefilled prompts, most recently used first.
pub(super) struct PrefixCache {
    entries: VecDeque<Entry>,
    budget: usize,
    held: usize,
}

/// Length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// An empty cache holding at most `budget` positions (0: never holds anything).
    pub(super) fn new(budget: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            budget,
            held: 0,
        }
    }

    /// The longest cached prefix of `prompt` computed under `adapter`, at most
    /// `prompt.len() − 1` positions (the last prompt token is always run, for its logits), and
    /// the cache holding it; `None` when no entry shares a token. The entry becomes the most
    /// recently used.
    pub(super) fn lookup(
        &mut self,
        adapter: Option<&Arc<LoraAdapter>>,
        prompt: &[u32],
    ) -> Option<(usize, &KvCache)> {
        let usable = prompt.len().saturating_sub(1);
        let (at, len) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.serves(adapter))
            .map(|(i, e)| (i, common(&e.tokens, prompt).min(usable)))
            .max_by_key(|&(i, len)| (len, std::cmp::Reverse(i)))?;
        if len == 0 {
            return None;
        }
        let entry = self.entries.remove(at)?;
        self.entries.push_front(entry);
        self.entries.front().map(|e| (len, &e.cache))
    }

    /// Keeps a copy of `cache` (holding exactly `tokens`, just prefilled under `adapter`) as the most recently used entry. An entry whose tokens start this prompt is
    /// replaced by it; a prompt that an entry already covers only refreshes that entry. A
    /// prompt longer than the whole budget is not kept.
    pub(super) fn insert(
        &mut self,
        adapter: Option<&Arc<LoraAdapter>>,
        tokens: &[u32],
        cache: &KvCache,
    ) -> Result<()> {
        if tokens.is_empty() || tokens.len() > self.budget || cache.len() != tokens.len() {
            return Ok(());
        }
        if let Some(i) = self
            .entries
            .iter()
            .position(|e| e.serves(adapter) && e.tokens.starts_with(tokens))
        {
            if let Some(e) = self.entries.remove(i) {
                self.entries.push_front(e);
            }
            return Ok(());
        }
        let before = self.entries.len();
        self.entries
            .retain(|e| !(e.serves(adapter) && tokens.starts_with(&e.tokens)));
        if self.entries.len() != before {
            self.held = self.entries.iter().map(|e| e.tokens.len()).sum();
        }
        let snapshot = cache.snapshot()?;
        self.entries.push_front(Entry {
            adapter: adapter.cloned(),
            tokens: tokens.to_vec(),
            cache: snapshot,
        });
        self.held += tokens.len();
        while self.held > self.budget {
            match self.entries.pop_back() {
                Some(e) => self.held -= e.tokens.len(),
                None => break,
            }
        }
        Ok(())
    }

    /// Positions held over all entries.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Architecture, ModelConfig};
    use candle_core::Device;

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: 16,
            hidden_size: 8,
            intermediate_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 4,
            rope_theta: 10_000.0,
            rope_scaling: None,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            attention_bias: false,
        }
    }

    /// A single-row cache that holds `len` positions (zeros: these tests are about which
    /// entry is chosen; the model tests check what reusing one computes).
    fn filled(len: usize) -> KvCache {
        let mut c = KvCache::new(&config(), 1, 64, &Device::Cpu).unwrap();
        c.set_len_for_test(len);
        c
    }

    fn adapter() -> Arc<LoraAdapter> {
        let (a, _) =
            LoraAdapter::new_trainable(Default::default(), &config(), &Device::Cpu, 0).unwrap();
        Arc::new(a)
    }

    #[test]
    fn the_longest_shared_prefix_under_the_same_adapter_is_reused() {
        let mut pc = PrefixCache::new(100);
        let a = adapter();
        pc.insert(None, &[1, 2, 3, 4], &filled(4)).unwrap();
        pc.insert(None, &[1, 2, 9], &filled(3)).unwrap();
        pc.insert(Some(&a), &[1, 2, 3, 4, 5, 6], &filled(6))
            .unwrap();
        // Base model: [1,2,3,4] shares 4 with the prompt, [1,2,9] only 2.
        let (len, c) = pc.lookup(None, &[1, 2, 3, 4, 7]).unwrap();
        assert_eq!((len, c.len()), (4, 4));
        // The same prompt again: all but its last token.
        assert_eq!(pc.lookup(None, &[1, 2, 3, 4]).unwrap().0, 3);
        // The adapter's entries serve only that adapter object.
        assert_eq!(pc.lookup(Some(&a), &[1, 2, 3, 4, 5, 6, 7]).unwrap().0, 6);
        let replaced = adapter();
        assert!(pc.lookup(Some(&replaced), &[1, 2, 3, 4, 5, 6, 7]).is_none());
        // Nothing shared, or a one-token prompt: no reuse.
        assert!(pc.lookup(None, &[5, 6]).is_none());
        assert!(pc.lookup(None, &[1]).is_none());
    }

    #[test]
    fn a_longer_prompt_replaces_its_prefix_and_the_budget_evicts_the_least_recent() {
        let mut pc = PrefixCache::new(10);
        pc.insert(None, &[1, 2, 3], &filled(3)).unwrap();
        // Extends [1,2,3]: replaces it.
        pc.insert(None, &[1, 2, 3, 4, 5], &filled(5)).unwrap();
        assert_eq!(pc.held(), 5);
        // Covered by [1,2,3,4,5]: only refreshes it.
        pc.insert(None, &[1, 2], &filled(2)).unwrap();
        assert_eq!(pc.held(), 5);
        pc.insert(None, &[7, 8, 9], &filled(3)).unwrap();
        assert_eq!(pc.held(), 8);
        // Use [1,2,3,4,5] so that [7,8,9] is the least recently used, then go over budget.
        assert!(pc.lookup(None, &[1, 2, 3, 4, 5, 6]).is_some());
        pc.insert(None, &[4, 4, 4, 4], &filled(4)).unwrap();
        assert_eq!(pc.held(), 9);
        assert!(pc.lookup(None, &[7, 8, 9, 1]).is_none());
        assert_eq!(pc.lookup(None, &[1, 2, 3, 4, 5, 6]).unwrap().0, 5);
        // Longer than the whole budget, or a cache not holding exactly the prompt: not kept.
        pc.insert(None, &[3; 11], &filled(11)).unwrap();
        pc.insert(None, &[6, 6], &filled(5)).unwrap();
        assert_eq!(pc.held(), 9);
        // A zero budget keeps nothing.
        let mut off = PrefixCache::new(0);
        off.insert(None, &[1, 2], &filled(2)).unwrap();
        assert!(off.lookup(None, &[1, 2, 3]).is_none());
    }
}
