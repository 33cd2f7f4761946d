//! The encoder's KV cache, one entry per layer (`DynamicCache` with `DynamicSlidingWindowLayer`).
//!
//! Full layers keep every token. Sliding layers keep only the last W−1 tokens after each update
//! (what the reference's dynamic sliding cache holds), which is exactly what the decoder sees.

/// K (after k_norm and RoPE) and V (after v_norm) of one layer, `[tokens, kv_heads, head_dim]`.
#[derive(Debug, Clone)]
pub struct LayerCache {
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Tokens kept at most (`Some(W − 1)` for sliding layers).
    pub retain: Option<usize>,
    /// Absolute position of the first kept token.
    pub start: usize,
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

impl LayerCache {
    pub fn new(kv_heads: usize, head_dim: usize, retain: Option<usize>) -> Self {
        LayerCache { kv_heads, head_dim, retain, start: 0, keys: Vec::new(), values: Vec::new() }
    }

    /// Number of kept tokens.
    pub fn len(&self) -> usize {
        self.keys.len() / (self.kv_heads * self.head_dim)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Appends new K/V and drops what the retention rule no longer keeps.
    pub fn append(&mut self, keys: &[f32], values: &[f32]) {
        self.keys.extend_from_slice(keys);
        self.values.extend_from_slice(values);
        if let Some(keep) = self.retain {
            let len = self.len();
            if len > keep {
                let drop = (len - keep) * self.kv_heads * self.head_dim;
                self.keys.drain(..drop);
                self.values.drain(..drop);
                self.start += len - keep;
            }
        }
    }
}

/// All layers' caches and the number of tokens encoded so far.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// Tokens encoded so far (the next position).
    pub seq_len: usize,
}

impl KvCache {
    /// Bytes the K/V buffers hold in memory (their capacity, not only the kept tokens).
    pub fn bytes(&self) -> u64 {
        let floats: usize = self.layers.iter().map(|l| l.keys.capacity() + l.values.capacity()).sum();
        (floats * size_of::<f32>()) as u64
    }

    /// Frees the buffers' room beyond the kept tokens (before the cache is kept aside).
    pub fn shrink_to_fit(&mut self) {
        for l in &mut self.layers {
            l.keys.shrink_to_fit();
            l.values.shrink_to_fit();
        }
    }
}
