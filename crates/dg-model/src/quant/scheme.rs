//! Quantization schemes: which ggml type each tensor of the model is stored in, as `dg quantize`
//! writes it and `--weights q4_k_m|q8_0` loads it ([`Quantized`] quantizes a source's tensors on
//! the fly, streaming).
//!
//! Both schemes keep at 16 bits or f32 what every quantized release keeps high: the embedding
//! (also the tied head), the router, the self-conditioning MLP, norms and scalars. `q8_0` stores
//! every other matrix as Q8_0. `q4_k_m` follows llama.cpp's `Q4_K_M` (`llama_tensor_get_type`):
//! the routed experts' gate/up as Q4_K, their down projection as Q6_K in the layers
//! `use_more_bits` picks (the first and last eighth, every third between) and Q4_K elsewhere,
//! falling back as llama.cpp does where a row is not a whole number of 256-value super-blocks
//! (the experts' down projection has K = 704): Q4_K → Q5_0, Q6_K → Q8_0. Attention and the dense
//! MLP are Q8_0.
//!
//! The schemes for small GPUs follow llama.cpp's `Q2_K`, `Q3_K_M` and `IQ4_XS` for the routed
//! experts (its `FFN_GATE`/`FFN_UP`/`FFN_DOWN` rules for a model of more than 8 experts, without
//! an importance matrix), attention and the dense MLP staying Q8_0 as in `q4_k_m`:
//! - `q2_k`: gate/up Q2_K, down Q3_K;
//! - `q3_k_m`: gate/up Q3_K, down Q5_K in the first sixteenth of the layers and Q4_K after;
//! - `iq4_xs`: gate/up IQ4_XS, down Q5_K in the first eighth of the layers and IQ4_XS after.
//!
//! with llama.cpp's fallbacks (`tensor_type_fallback`) where a row is not whole super-blocks: Q2_K
//! and Q3_K → Q4_0, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, IQ4_XS → IQ4_NL. No importance matrix is
//! taken: IQ4_XS is written as ggml's `quantize_iq4_xs` writes it without one.

use crate::config::TextConfig;
use crate::error::{ModelError, Result};
use crate::names::{LayerNames, SharedNames};
use crate::stored::{StoredDtype, StoredTensor};
use crate::weights::TensorSource;

/// A quantization scheme (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Q8_0,
    Q4KM,
    Q2K,
    Q3KM,
    IQ4XS,
}

impl Scheme {
    pub const ALL: [Scheme; 5] = [Scheme::Q4KM, Scheme::Q8_0, Scheme::Q2K, Scheme::Q3KM, Scheme::IQ4XS];

    /// The scheme's name as users write it (`q4_k_m`, `q8_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Q8_0 => "q8_0",
            Scheme::Q4KM => "q4_k_m",
            Scheme::Q2K => "q2_k",
            Scheme::Q3KM => "q3_k_m",
            Scheme::IQ4XS => "iq4_xs",
        }
    }

    /// The scheme named `name`; an error listing the schemes otherwise.
    pub fn parse(name: &str) -> Result<Scheme> {
        Scheme::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| ModelError::UnknownScheme { name: name.to_string(), expected: Scheme::ALL.map(Scheme::name).join(", ") })
    }

    /// The type each of `cfg`'s tensors is stored in under this scheme: `None` keeps the
    /// tensor as the source stores it. Names the manifest does not know are kept.
    pub fn dtype_of(self, cfg: &TextConfig, name: &str) -> Option<StoredDtype> {
        let n_layers = cfg.num_layers();
        (0..n_layers).find_map(|i| {
            let l = LayerNames::new(cfg, i);
            let dense = [
                Some(&l.q_proj),
                Some(&l.k_proj),
                l.v_proj.as_ref(),
                Some(&l.o_proj),
                Some(&l.mlp_gate),
                Some(&l.mlp_up),
                Some(&l.mlp_down),
            ];
            let row = |shape: &[usize]| *shape.last().expect("matrices have rows");
            if let Some(m) = dense.into_iter().flatten().find(|m| m.name == name) {
                return fitting(StoredDtype::Q8_0, row(&m.shape));
            }
            let down = name == l.experts_down.name;
            let wanted = match self {
                Scheme::Q8_0 => StoredDtype::Q8_0,
                Scheme::Q4KM if down && use_more_bits(i, n_layers) => StoredDtype::Q6_K,
                Scheme::Q4KM => StoredDtype::Q4_K,
                Scheme::Q2K if down => StoredDtype::Q3_K,
                Scheme::Q2K => StoredDtype::Q2_K,
                Scheme::Q3KM if down && i < n_layers / 16 => StoredDtype::Q5_K,
                Scheme::Q3KM if down => StoredDtype::Q4_K,
                Scheme::Q3KM => StoredDtype::Q3_K,
                Scheme::IQ4XS if down && i < n_layers / 8 => StoredDtype::Q5_K,
                Scheme::IQ4XS => StoredDtype::IQ4_XS,
            };
            [&l.experts_gate_up, &l.experts_down].into_iter().find(|m| m.name == name).and_then(|m| fitting(wanted, row(&m.shape)))
        })
    }

    /// Every tensor of `cfg` this scheme quantizes, with its type: what `dg quantize` reports.
    pub fn plan(self, cfg: &TextConfig) -> Vec<(String, StoredDtype)> {
        let shared = SharedNames::new(cfg);
        let layers: Vec<LayerNames> = (0..cfg.num_layers()).map(|i| LayerNames::new(cfg, i)).collect();
        let names = shared.all().into_iter().chain(layers.iter().flat_map(LayerNames::all)).map(|n| n.name.clone());
        names.filter_map(|n| self.dtype_of(cfg, &n).map(|d| (n, d))).collect()
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`: the first and last eighth of the layers and
/// every third layer between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// `wanted`, or llama.cpp's fallback (`tensor_type_fallback`) where a row of `row` values is not
/// whole blocks of it (Q2_K, Q3_K → Q4_0; Q4_K → Q5_0; Q5_K → Q5_1; Q6_K → Q8_0; IQ4_XS →
/// IQ4_NL); `None` where no quantized type fits the row (llama.cpp writes F16 there).
fn fitting(wanted: StoredDtype, row: usize) -> Option<StoredDtype> {
    let fallback = |d: StoredDtype| match d {
        StoredDtype::Q2_K | StoredDtype::Q3_K => Some(StoredDtype::Q4_0),
        StoredDtype::Q4_K => Some(StoredDtype::Q5_0),
        StoredDtype::Q5_K => Some(StoredDtype::Q5_1),
        StoredDtype::Q6_K => Some(StoredDtype::Q8_0),
        StoredDtype::IQ4_XS => Some(StoredDtype::IQ4_NL),
        _ => None,
    };
    let mut d = Some(wanted);
    while let Some(t) = d {
        if row.is_multiple_of(t.block_len()) {
            return Some(t);
        }
        d = fallback(t);
    }
    None
}

/// Values quantized per task when quantizing a tensor (whole super-blocks; a Q4_K tensor of 500M
/// values then holds 8 MiB of f32 at a time per thread, never the tensor).
const QUANTIZE_CHUNK: usize = 1 << 21;

/// A source whose tensors come quantized by a [`Scheme`]: the others as the inner source stores
/// them. Each quantized tensor is widened and quantized in chunks, so the host holds its
/// quantized bytes and one f32 chunk per thread.
#[derive(Debug)]
pub struct Quantized<'c, S> {
    pub inner: S,
    pub scheme: Scheme,
    pub config: &'c TextConfig,
}

impl<S: TensorSource> TensorSource for Quantized<'_, S> {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let t = self.inner.stored(name, shape)?;
        match self.scheme.dtype_of(self.config, name) {
            Some(dtype) if dtype != t.dtype => quantize_tensor(&t, dtype, name),
            _ => Ok(t),
        }
    }
}

/// `t` quantized to `dtype` (its rows whole blocks of it).
pub fn quantize_tensor(t: &StoredTensor<'_>, dtype: StoredDtype, name: &str) -> Result<StoredTensor<'static>> {
    use rayon::prelude::*;
    let chunk = QUANTIZE_CHUNK / dtype.block_len() * dtype.block_len();
    let bytes_per_chunk = dtype.bytes_for(chunk).expect("whole blocks");
    let mut out = vec![
        0u8;
        dtype.bytes_for(t.len()).ok_or_else(|| ModelError::Quantize {
            name: name.to_string(),
            message: format!("{} values are not whole {} blocks", t.len(), dtype.name()),
        })?
    ];
    out.par_chunks_mut(bytes_per_chunk).enumerate().try_for_each(|(c, dst)| {
        let mut wide = vec![0f32; dst.len() / dtype.block_bytes() * dtype.block_len()];
        t.widen_range(c * chunk, &mut wide);
        let q =
            crate::quant::quantize(dtype, &wide).map_err(|e| ModelError::Quantize { name: name.to_string(), message: e.to_string() })?;
        dst.copy_from_slice(&q);
        Ok::<(), ModelError>(())
    })?;
    Ok(StoredTensor::from_bytes(dtype, t.shape.clone(), out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_picks_more_bits_for_the_ends_and_every_third_layer() {
        let picked: Vec<usize> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
    }

    #[test]
    fn rows_that_are_not_super_blocks_fall_back() {
        assert_eq!(fitting(StoredDtype::Q4_K, 2816), Some(StoredDtype::Q4_K));
        assert_eq!(fitting(StoredDtype::Q4_K, 704), Some(StoredDtype::Q5_0));
        assert_eq!(fitting(StoredDtype::Q6_K, 704), Some(StoredDtype::Q8_0));
        assert_eq!(fitting(StoredDtype::Q8_0, 48), None);
        assert_eq!(fitting(StoredDtype::Q2_K, 704), Some(StoredDtype::Q4_0));
        assert_eq!(fitting(StoredDtype::Q3_K, 704), Some(StoredDtype::Q4_0));
        assert_eq!(fitting(StoredDtype::Q5_K, 704), Some(StoredDtype::Q5_1));
        assert_eq!(fitting(StoredDtype::IQ4_XS, 704), Some(StoredDtype::IQ4_NL));
        assert_eq!(fitting(StoredDtype::IQ4_XS, 2816), Some(StoredDtype::IQ4_XS));
    }

    #[test]
    fn the_small_gpu_schemes_pick_llama_cpp_types_at_the_real_geometry() {
        let cfg = real_config();
        let (first, later) = (LayerNames::new(&cfg, 0), LayerNames::new(&cfg, 3));
        let of = |s: Scheme, name: &str| s.dtype_of(&cfg, name);
        // (scheme, gate/up, down in layer 0, down in layer 3): the down projection's K = 704 falls back.
        for (scheme, gate_up, down0, down3) in [
            (Scheme::Q2K, StoredDtype::Q2_K, StoredDtype::Q4_0, StoredDtype::Q4_0),
            (Scheme::Q3KM, StoredDtype::Q3_K, StoredDtype::Q5_1, StoredDtype::Q5_0),
            (Scheme::IQ4XS, StoredDtype::IQ4_XS, StoredDtype::Q5_1, StoredDtype::IQ4_NL),
        ] {
            assert_eq!(of(scheme, &later.experts_gate_up.name), Some(gate_up), "{}", scheme.name());
            assert_eq!(of(scheme, &first.experts_down.name), Some(down0), "{}", scheme.name());
            assert_eq!(of(scheme, &later.experts_down.name), Some(down3), "{}", scheme.name());
            assert_eq!(of(scheme, &later.q_proj.name), Some(StoredDtype::Q8_0), "{}", scheme.name());
            assert_eq!(of(scheme, &later.router_proj.name), None, "{}", scheme.name());
            assert_eq!(Scheme::parse(scheme.name()).unwrap(), scheme);
        }
        // Layer 2 is past the sixteenth (1 of 30 layers) but inside the eighth (3).
        let l2 = LayerNames::new(&cfg, 2);
        assert_eq!(of(Scheme::Q3KM, &l2.experts_down.name), Some(StoredDtype::Q5_0));
        assert_eq!(of(Scheme::IQ4XS, &l2.experts_down.name), Some(StoredDtype::Q5_1));
        let sizes: Vec<f64> = [Scheme::Q2K, Scheme::Q3KM, Scheme::IQ4XS].map(|s| stored_bytes(&cfg, s) as f64 / 1e9).to_vec();
        assert!(sizes[0] < sizes[1] && sizes[1] < sizes[2] && sizes[2] < stored_bytes(&cfg, Scheme::Q4KM) as f64 / 1e9, "{sizes:?}");
    }

    fn real_config() -> TextConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/configs/real-30layer.json");
        crate::ModelConfig::from_file(&path).unwrap().text
    }

    /// Bytes of every tensor of `cfg` under `scheme` (kept tensors at 2 bytes, as BF16).
    fn stored_bytes(cfg: &TextConfig, scheme: Scheme) -> u64 {
        crate::tensor_manifest(cfg)
            .iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                scheme.dtype_of(cfg, name).map_or(2 * n, |d| d.bytes_for(n).unwrap()) as u64
            })
            .sum()
    }

    #[test]
    fn the_real_model_fits_the_sizes_its_schemes_promise() {
        let cfg = real_config();
        let (q4, q8) = (stored_bytes(&cfg, Scheme::Q4KM), stored_bytes(&cfg, Scheme::Q8_0));
        // 18.41 GB and 27.55 GB (Unsloth's Q4_K_M GGUF is about 16 GB, quantizing the embedding
        // too; its Q8_0 about 25 GB); the bars for the weights on the GPU are 20 and 30 GB.
        assert!((18.3e9..18.5e9).contains(&(q4 as f64)), "q4_k_m: {q4} bytes");
        assert!((27.4e9..27.7e9).contains(&(q8 as f64)), "q8_0: {q8} bytes");
        let l = LayerNames::new(&cfg, 3);
        assert_eq!(Scheme::Q4KM.dtype_of(&cfg, &l.experts_gate_up.name), Some(StoredDtype::Q4_K));
        assert_eq!(Scheme::Q4KM.dtype_of(&cfg, &l.experts_down.name), Some(StoredDtype::Q5_0));
        assert_eq!(Scheme::Q4KM.dtype_of(&cfg, &LayerNames::new(&cfg, 0).experts_down.name), Some(StoredDtype::Q8_0));
        assert_eq!(Scheme::Q4KM.dtype_of(&cfg, &l.q_proj.name), Some(StoredDtype::Q8_0));
        for kept in [
            &l.router_proj.name,
            &l.norms[0].name,
            &l.decoder_scalar.name,
            &SharedNames::new(&cfg).embed.name,
            &SharedNames::new(&cfg).sc_up.name,
        ] {
            assert_eq!(Scheme::Q4KM.dtype_of(&cfg, kept), None, "{kept}");
        }
    }

    #[test]
    fn a_quantized_source_serves_the_schemes_types_and_ggml_values() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random");
        let cfg = crate::ModelConfig::from_file(&dir.join("config.json")).unwrap().text;
        let random = crate::RandomWeights::new(7);
        let q = Quantized { inner: &random, scheme: Scheme::Q8_0, config: &cfg };
        let plan = Scheme::Q8_0.plan(&cfg);
        assert!(!plan.is_empty());
        for (name, shape) in crate::tensor_manifest(&cfg) {
            let t = q.stored(&name, &shape).unwrap();
            let want = Scheme::Q8_0.dtype_of(&cfg, &name);
            assert_eq!(plan.iter().find(|(n, _)| *n == name).map(|p| p.1), want);
            match want {
                Some(d) => {
                    assert_eq!(t.dtype, d, "{name}");
                    let original = random.stored(&name, &shape).unwrap().to_f32();
                    assert_eq!(t.to_f32(), crate::dequantize_bytes(d, &crate::quantize(d, &original).unwrap()).unwrap(), "{name}");
                }
                None => assert_eq!(t.dtype, random.stored(&name, &shape).unwrap().dtype, "{name}"),
            }
        }
        assert!(matches!(Scheme::parse("q4_k_s"), Err(ModelError::UnknownScheme { .. })));
    }
}
