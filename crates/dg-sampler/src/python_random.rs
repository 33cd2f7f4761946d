//! Python's `random.Random`: MT19937 seeded as CPython seeds it from an int, `getrandbits` and
//! `randrange`, bit for bit.
//!
//! OpenJev (`openjev/engine.py`, `Engine.build_canvas`) fills each answer slot of a read's seed
//! canvas with `random.Random(seed).randrange(VOCAB)`; a server that answers OpenJev's requests
//! with the same canvases needs the same draws. This is that noise mode, not the sampler's
//! randomness ([`crate::SeededRng`]).
//!
//! Mirrors CPython's `Modules/_randommodule.c` (`init_genrand`, `init_by_array`, `genrand_uint32`,
//! `random_seed` for a non-negative int: its absolute value split into 32-bit words, least
//! significant first) and `Lib/random.py` (`_randbelow_with_getrandbits`: `getrandbits(k)` with
//! `k = n.bit_length()`, redrawn until below n).

const N: usize = 624;
const M: usize = 397;

/// CPython's `random.Random`.
#[derive(Clone)]
pub struct PythonRandom {
    state: [u32; N],
    index: usize,
}

impl std::fmt::Debug for PythonRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonRandom").field("index", &self.index).finish_non_exhaustive()
    }
}

impl PythonRandom {
    /// `random.Random(seed)` for an int seed (CPython uses `abs(seed)`).
    pub fn new(seed: i64) -> Self {
        let n = seed.unsigned_abs();
        let key: Vec<u32> = if n >> 32 == 0 { vec![n as u32] } else { vec![n as u32, (n >> 32) as u32] };
        let mut r = PythonRandom { state: [0; N], index: N };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.state[0] = s;
        for i in 1..N {
            let prev = self.state[i - 1];
            self.state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.state[i - 1];
            self.state[i] = (self.state[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525)).wrapping_add(key[j]).wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.state[0] = self.state[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.state[i - 1];
            self.state[i] = (self.state[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.state[0] = self.state[N - 1];
                i = 1;
            }
        }
        self.state[0] = 0x8000_0000;
    }

    /// The next 32 random bits (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for k in 0..N {
                let y = (self.state[k] & 0x8000_0000) | (self.state[(k + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.state[k] = self.state[(k + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for `k ≤ 32`.
    pub fn getrandbits(&mut self, k: u32) -> u32 {
        assert!(k <= 32, "getrandbits({k}): at most 32 bits here");
        if k == 0 { 0 } else { self.next_u32() >> (32 - k) }
    }

    /// `randrange(n)`: uniform in `[0, n)`, `n` in `1..=2^32 − 1`.
    pub fn randrange(&mut self, n: u32) -> u32 {
        assert!(n > 0, "randrange(0) is empty");
        let k = u32::BITS - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }
}
