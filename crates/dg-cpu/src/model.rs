//! The whole model on the CPU: encoder into a KV cache, and the decoder's canvas forward; several
//! sequences through `dg_sampler::PerSlot`, each in its own cache.
//!
//! Mirrors `DiffusionGemmaEncoderTextModel` (causal, writes the cache; its final norm and hidden
//! state are unused in generation and not computed) and `DiffusionGemmaDecoderModel` +
//! `DiffusionGemmaSelfConditioning` + the tied, softcapped head of
//! `DiffusionGemmaForBlockDiffusion.forward`.

use dg_model::{LayerKind, ModelConfig, Weights};

use crate::cache::{KvCache, LayerCache};
use crate::int8::ActivationQuant;
use crate::layer::{Pass, RouterTrace, layer_forward};
use crate::linalg::{Threads, View, linear, matmul};
use crate::ops::{gelu_glu, rms_norm_into, rms_norm_rows, softcap_in_place, softmax_rows_into};

/// Bad input to the CPU model.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("token id {id} at position {index} is out of range (vocab_size {vocab})")]
    TokenOutOfRange { id: u32, index: usize, vocab: usize },
    #[error("{what}: got {got} values, expected {expected}")]
    Length { what: &'static str, got: usize, expected: usize },
    #[error("sequence of {len} tokens exceeds max_position_embeddings {max}")]
    TooLong { len: usize, max: usize },
    #[error("nothing to encode: empty token list")]
    Empty,
    #[error("the cache does not fit this model: {0}")]
    CacheMismatch(String),
    #[error("read: {0}")]
    Read(String),
}

/// The f32 reference model with its KV cache.
#[derive(Debug)]
pub struct CpuModel {
    pub config: ModelConfig,
    pub weights: Weights,
    /// How the experts' products take their activations (f32 unless a caller measures the int8
    /// mode, [`ActivationQuant::Int8`]).
    pub activation_quant: ActivationQuant,
    cache: KvCache,
}

impl CpuModel {
    pub fn new(config: ModelConfig, weights: Weights) -> Self {
        let cache = empty_cache(&config);
        CpuModel { config, weights, activation_quant: ActivationQuant::F32, cache }
    }

    /// Drops every cached token.
    pub fn reset(&mut self) {
        self.cache = empty_cache(&self.config);
    }

    /// Tokens encoded so far; the next canvas sits at `seq_len()..seq_len()+C`.
    pub fn seq_len(&self) -> usize {
        self.cache.seq_len
    }

    /// The cache (per-layer K/V) for inspection by parity checks.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Takes the cache out, leaving an empty one: a conversation's cache kept aside while others
    /// run, and given back with [`Self::put_cache`].
    pub fn take_cache(&mut self) -> KvCache {
        std::mem::replace(&mut self.cache, empty_cache(&self.config))
    }

    /// Puts back a cache taken out of a model of the same configuration; the next encode and canvas
    /// forward continue from it.
    pub fn put_cache(&mut self, cache: KvCache) -> Result<(), CpuError> {
        let expected = empty_cache(&self.config);
        if cache.layers.len() != expected.layers.len() {
            return Err(CpuError::CacheMismatch(format!("{} layers, the model has {}", cache.layers.len(), expected.layers.len())));
        }
        for (i, (got, want)) in cache.layers.iter().zip(&expected.layers).enumerate() {
            let per_token = want.kv_heads * want.head_dim;
            if (got.kv_heads, got.head_dim, got.retain) != (want.kv_heads, want.head_dim, want.retain)
                || got.keys.len() != got.values.len()
                || got.keys.len() % per_token != 0
                || got.start + got.len() != cache.seq_len
            {
                return Err(CpuError::CacheMismatch(format!(
                    "layer {i}: {} kv heads x {} dims, retain {:?}, {} key and {} value floats from position {} of {}",
                    got.kv_heads,
                    got.head_dim,
                    got.retain,
                    got.keys.len(),
                    got.values.len(),
                    got.start,
                    cache.seq_len
                )));
            }
        }
        let max = self.config.text.max_position_embeddings;
        if cache.seq_len > max {
            return Err(CpuError::TooLong { len: cache.seq_len, max });
        }
        self.cache = cache;
        Ok(())
    }

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<(), CpuError> {
        let vocab = self.config.text.vocab_size;
        match ids.iter().enumerate().find(|&(_, &id)| id as usize >= vocab) {
            Some((index, &id)) => Err(CpuError::TokenOutOfRange { id, index, vocab }),
            None => Ok(()),
        }
    }

    pub(crate) fn check_positions(&self, new: usize) -> Result<(), CpuError> {
        let len = self.cache.seq_len + new;
        let max = self.config.text.max_position_embeddings;
        if len > max { Err(CpuError::TooLong { len, max }) } else { Ok(()) }
    }

    /// `E[ids] · sqrt(H)`, `[T, H]`.
    pub(crate) fn embed(&self, ids: &[u32]) -> Vec<f32> {
        let h = self.config.text.hidden_size;
        let scale = self.config.text.embed_scale();
        let mut out = Vec::with_capacity(ids.len() * h);
        for &id in ids {
            let row = &self.weights.embed.data[id as usize * h..(id as usize + 1) * h];
            out.extend(row.iter().map(|&v| v * scale));
        }
        out
    }

    /// Encodes `ids` causally at the next positions and appends their K/V to the cache
    /// (prompt prefill, or a committed canvas). Image placeholders are looked up as the pad id.
    pub fn encode(&mut self, ids: &[u32]) -> Result<(), CpuError> {
        self.encode_inner(ids, None)
    }

    /// Encodes a prompt that holds images (`DiffusionGemmaEncoderModel` as `generate` runs it):
    /// the rows of the image soft tokens (`image_token_id`) are replaced, in order, by
    /// `image_embeddings` (`[n, H]`, [`crate::vision::embed_vision`]'s output for each image in
    /// turn), and with `use_bidirectional_attention: "vision"` each run of soft tokens sees itself
    /// whole. An image's run must lie within one call.
    pub fn encode_with_images(&mut self, ids: &[u32], image_embeddings: &[f32]) -> Result<(), CpuError> {
        self.encode_inner(ids, Some(image_embeddings))
    }

    fn encode_inner(&mut self, ids: &[u32], image_embeddings: Option<&[f32]>) -> Result<(), CpuError> {
        if ids.is_empty() {
            return Err(CpuError::Empty);
        }
        self.check_ids(ids)?;
        self.check_positions(ids.len())?;
        let cfg = &self.config.text;
        let is_image = |id: u32| self.config.image_token_id == Some(id);
        // Image placeholders are replaced by pad before embedding (HF's `llm_input_ids`).
        let looked_up: Vec<u32> = ids
            .iter()
            .map(|&id| match cfg.pad_token_id {
                Some(pad) if is_image(id) => pad,
                _ => id,
            })
            .collect();
        let t = ids.len();
        let start = self.cache.seq_len;
        let mut h = self.embed(&looked_up);
        let mut spans = Vec::new();
        if let Some(embeddings) = image_embeddings {
            let hid = cfg.hidden_size;
            let slots: Vec<usize> = (0..t).filter(|&i| is_image(ids[i])).collect();
            if embeddings.len() != slots.len() * hid {
                return Err(CpuError::Length { what: "image embeddings", got: embeddings.len(), expected: slots.len() * hid });
            }
            for (&i, row) in slots.iter().zip(embeddings.chunks_exact(hid)) {
                h[i * hid..(i + 1) * hid].copy_from_slice(row);
            }
            if self.config.images_bidirectional {
                spans = runs(&slots, start);
            }
        }
        let last = cfg.num_layers() - 1;
        for (i, (w, spec)) in self.weights.layers.iter().zip(&cfg.layers).enumerate() {
            let pass = Pass::Encode(&mut self.cache.layers[i], &spans);
            layer_forward(&mut h, t, start, w, spec, cfg, pass, i == last, None, self.activation_quant);
        }
        self.cache.seq_len += t;
        Ok(())
    }

    /// The decoder input: `post_norm(E[canvas]·√H + MLP_sc(pre_norm(softmax(sc)·E·√H)))`.
    pub fn decoder_input(&self, canvas: &[u32], self_conditioning: Option<&[f32]>) -> Vec<f32> {
        let h = self.config.text.hidden_size;
        let mut x = self.embed(canvas);
        if let Some(sc) = self_conditioning {
            let signal = self.self_conditioning_signal(sc, canvas.len());
            x.iter_mut().zip(&signal).for_each(|(x, s)| *x += s);
        }
        rms_norm_rows(&mut x, h, None, self.config.text.rms_norm_eps);
        x
    }

    /// `MLP_sc(pre_norm(softmax(sc)·E·√H))` of `rows` rows of self-conditioning logits, `[rows, H]`
    /// (a row without self-conditioning has `s = 0`, whose signal is 0).
    pub(crate) fn self_conditioning_signal(&self, sc: &[f32], rows: usize) -> Vec<f32> {
        let cfg = &self.config.text;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let mut probs = vec![0f32; sc.len()];
        softmax_rows_into(&mut probs, sc, v);
        let mut soft = vec![0f32; rows * h];
        let e = &self.weights.embed;
        matmul(&mut soft, h, View::rows(&probs, rows, v), View::rows(&e.data, v, h), false, Threads::All);
        let scale = cfg.embed_scale();
        soft.iter_mut().for_each(|s| *s *= scale);
        let scw = &self.weights.self_conditioning;
        let mut normed = vec![0f32; rows * h];
        rms_norm_into(&mut normed, &soft, h, Some(&scw.pre_norm), cfg.rms_norm_eps);
        let inter = cfg.intermediate_size;
        let mut gate = vec![0f32; rows * inter];
        let mut up = vec![0f32; rows * inter];
        linear(&mut gate, &normed, rows, &scw.gate);
        linear(&mut up, &normed, rows, &scw.up);
        gelu_glu(&mut gate, &up);
        linear(&mut soft, &gate, rows, &scw.down);
        soft
    }

    /// Runs decoder layers `layers` over `h: [C, H]` for a canvas at the next positions.
    pub fn decoder_layers(&self, h: &mut [f32], tokens: usize, layers: std::ops::Range<usize>) {
        let cfg = &self.config.text;
        for i in layers {
            let pass = Pass::Decode(&self.cache.layers[i]);
            layer_forward(
                h,
                tokens,
                self.cache.seq_len,
                &self.weights.layers[i],
                &cfg.layers[i],
                cfg,
                pass,
                false,
                None,
                self.activation_quant,
            );
        }
    }

    /// Decoder layer `i` over `h` as [`Self::decoder_layers`] runs it, its experts `chosen`
    /// (`[C, k]` ids) where given; returns what its router saw and chose.
    pub fn decoder_layer_routed(&self, h: &mut [f32], tokens: usize, i: usize, chosen: Option<&[usize]>) -> RouterTrace {
        let cfg = &self.config.text;
        let pass = Pass::Decode(&self.cache.layers[i]);
        layer_forward(
            h,
            tokens,
            self.cache.seq_len,
            &self.weights.layers[i],
            &cfg.layers[i],
            cfg,
            pass,
            false,
            chosen,
            self.activation_quant,
        )
        .expect("a decoder layer runs whole")
    }

    /// Final norm, tied head and softcap: `logits[C, V]` from `h: [C, H]`.
    pub fn head(&self, h: &[f32], tokens: usize, logits: &mut [f32]) {
        let cfg = &self.config.text;
        let mut z = vec![0f32; h.len()];
        rms_norm_into(&mut z, h, cfg.hidden_size, Some(&self.weights.final_norm), cfg.rms_norm_eps);
        linear(logits, &z, tokens, &self.weights.embed);
        if let Some(cap) = cfg.final_logit_softcapping {
            softcap_in_place(logits, cap);
        }
    }

    /// One denoising forward of `canvas` (C ids) at positions `seq_len()..`, with the previous
    /// step's temperature-scaled logits `[C, V]` as self-conditioning, into `logits[C, V]`.
    pub fn canvas_forward(&self, canvas: &[u32], self_conditioning: Option<&[f32]>, logits: &mut [f32]) -> Result<(), CpuError> {
        let cfg = &self.config.text;
        let c = self.config.canvas_length;
        if canvas.len() != c {
            return Err(CpuError::Length { what: "canvas", got: canvas.len(), expected: c });
        }
        let cv = c * cfg.vocab_size;
        if let Some(sc) = self_conditioning
            && sc.len() != cv
        {
            return Err(CpuError::Length { what: "self-conditioning logits", got: sc.len(), expected: cv });
        }
        if logits.len() != cv {
            return Err(CpuError::Length { what: "logits buffer", got: logits.len(), expected: cv });
        }
        self.check_ids(canvas)?;
        self.check_positions(c)?;
        let mut h = self.decoder_input(canvas, self_conditioning);
        self.decoder_layers(&mut h, c, 0..cfg.num_layers());
        self.head(&h, c, logits);
        Ok(())
    }
}

/// The maximal runs of consecutive indices in `sorted` (HF's `get_block_sequence_ids_for_mask`
/// groups), as absolute positions from `start`.
fn runs(sorted: &[usize], start: usize) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for &i in sorted {
        match out.last_mut() {
            Some(run) if run.end == start + i => run.end += 1,
            _ => out.push(start + i..start + i + 1),
        }
    }
    out
}

fn empty_cache(config: &ModelConfig) -> KvCache {
    let cfg = &config.text;
    let layers = cfg
        .layers
        .iter()
        .map(|l| {
            let retain = (l.kind == LayerKind::Sliding).then(|| cfg.sliding_kept());
            LayerCache::new(l.num_kv_heads, l.head_dim, retain)
        })
        .collect();
    KvCache { layers, seq_len: 0 }
}

impl dg_sampler::DenoiseModel for CpuModel {
    type Error = CpuError;

    fn encode(&mut self, ids: &[u32]) -> Result<(), CpuError> {
        CpuModel::encode(self, ids)
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), CpuError> {
        CpuModel::canvas_forward(self, canvas, sc, logits)
    }
}

/// The CPU encoder places image rows ([`dg_sampler::ImagePrompt`] runs a prompt holding images).
impl dg_sampler::EncodeWithImages for CpuModel {
    type Error = CpuError;

    fn encode_with_images(&mut self, ids: &[u32], image_embeddings: &[f32]) -> Result<(), CpuError> {
        CpuModel::encode_with_images(self, ids, image_embeddings)
    }
}

/// A sequence's state is its KV cache: [`dg_sampler::PerSlot`] runs several sequences on one
/// `CpuModel`, each in its own cache ([`CpuModel::take_cache`], [`CpuModel::put_cache`]).
impl dg_sampler::SwapCache for CpuModel {
    type Cache = KvCache;
    type CacheError = CpuError;

    fn take_cache(&mut self) -> KvCache {
        CpuModel::take_cache(self)
    }

    fn put_cache(&mut self, cache: KvCache) -> Result<(), CpuError> {
        CpuModel::put_cache(self, cache)
    }
}
