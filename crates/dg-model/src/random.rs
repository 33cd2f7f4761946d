//! Seeded random weights for any config, generated in memory (benchmarks at the real geometry
//! without a 52 GB download). Deterministic: the values of a tensor depend only on the seed and
//! the tensor's name, never on thread count or load order.

use rayon::prelude::*;

use crate::config::TextConfig;
use crate::error::Result;
use crate::stored::StoredTensor;
use crate::weights::{TensorSource, Weights};

/// A [`TensorSource`] that invents every tensor from `(seed, name)`.
#[derive(Debug, Clone, Copy)]
pub struct RandomWeights {
    pub seed: u64,
}

impl RandomWeights {
    pub fn new(seed: u64) -> Self {
        RandomWeights { seed }
    }
}

impl Weights {
    /// Random weights of the right shapes: linear layers uniform with variance `1/in`, embedding
    /// with unit variance, norm weights and scales around 1, layer scalars in [0.5, 1].
    pub fn random(cfg: &TextConfig, seed: u64) -> Result<Self> {
        Weights::build(&RandomWeights { seed }, cfg)
    }
}

impl TensorSource for RandomWeights {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let n: usize = shape.iter().product();
        let base = splitmix(self.seed ^ fnv1a(name));
        let (center, half_width) = if name.ends_with("layer_scalar") {
            (0.75, 0.25)
        } else if name.ends_with("norm.weight") || name.ends_with(".scale") || name.ends_with("per_expert_scale") {
            (1.0, 0.2)
        } else if name.ends_with("embed_tokens.weight") {
            (0.0, 3f32.sqrt())
        } else {
            let fan_in = *shape.last().unwrap_or(&1) as f32;
            (0.0, (3.0 / fan_in).sqrt())
        };
        let mut out = vec![0f32; n];
        const CHUNK: usize = 1 << 16;
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
            let mut state = splitmix(base ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for x in chunk {
                state = splitmix(state);
                let u = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                *x = center + half_width * (2.0 * u - 1.0);
            }
        });
        Ok(StoredTensor::from_f32(shape.to_vec(), out))
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
