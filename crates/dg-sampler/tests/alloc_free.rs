//! The step loop does not allocate: a counting global allocator sees no allocation between the end of a
//! generation's first step and the end of the generation (other blocks, encodes and steps included).
//!
//! Rayon itself allocates a job block (about 1.5 KiB) every 63 parallel sections entered from outside its
//! pool, so the exact-zero check runs inside a pool; from outside, the count is bounded by that rate.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dg_model::GenerationConfig;
use dg_sampler::{DenoiseModel, DrawKind, Hooks, NoHooks, Replay, Sampler, SeededRng, StepInfo};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Logits from the canvas alone, written in place; never allocates.
struct Quiet {
    vocab: usize,
}

impl DenoiseModel for Quiet {
    type Error = std::io::Error;
    fn encode(&mut self, _ids: &[u32]) -> Result<(), Self::Error> {
        Ok(())
    }
    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), Self::Error> {
        for (i, row) in logits.chunks_mut(self.vocab).enumerate() {
            let peak = (canvas[i] as usize * 7 + i) % self.vocab;
            for (j, x) in row.iter_mut().enumerate() {
                let s = sc.map_or(0.0, |sc| 0.01 * sc[i * self.vocab + j]);
                *x = if j == peak { 9.0 + s } else { ((j % 5) as f32) * 0.2 + s };
            }
        }
        Ok(())
    }
}

/// Records the allocation count after the first step and at the end.
#[derive(Default)]
struct Marks {
    after_first_step: Option<usize>,
    steps: usize,
}

impl Hooks for Marks {
    fn on_step(&mut self, _info: &StepInfo<'_>) {
        self.steps += 1;
        if self.after_first_step.is_none() {
            self.after_first_step = Some(ALLOCATIONS.load(Ordering::SeqCst));
        }
    }
}

fn replay_draws(c: usize) -> Replay {
    let mut draws = vec![];
    for _ in 0..3 {
        draws.push((DrawKind::UniformTokens, vec![7; c]));
        for _ in 0..8 {
            draws.push((DrawKind::Categorical, vec![11; c]));
            draws.push((DrawKind::UniformTokens, vec![13; c]));
        }
    }
    Replay::new(draws)
}

#[test]
fn steps_do_not_allocate() {
    let (c, v) = (64, 3000);
    let cfg = GenerationConfig { max_new_tokens: 3 * c, max_denoising_steps: 8, stopping: None, ..GenerationConfig::default() };
    let mut sampler = Sampler::new(c, v).unwrap();
    let mut model = Quiet { vocab: v };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();

    // Inside a rayon pool (after warm-up runs that let its threads register with the work-stealing
    // machinery, a one-time allocation per thread): exactly zero, with the seeded source and a replay.
    for seed in 0..3 {
        pool.install(|| sampler.generate(&mut model, &[1], &cfg, &mut SeededRng::new(seed), &mut NoHooks)).unwrap();
    }
    for seeded in [true, false] {
        let mut marks = Marks::default();
        let mut replay = replay_draws(c);
        let mut rng = SeededRng::new(5);
        let g = pool
            .install(|| {
                if seeded {
                    sampler.generate(&mut model, &[1, 2, 3], &cfg, &mut rng, &mut marks)
                } else {
                    sampler.generate(&mut model, &[1, 2, 3], &cfg, &mut replay, &mut marks)
                }
            })
            .unwrap();
        let end = ALLOCATIONS.load(Ordering::SeqCst);
        assert_eq!((marks.steps, &g.steps_per_canvas[..]), (24, &[8, 8, 8][..]));
        assert_eq!(end - marks.after_first_step.unwrap(), 0, "allocations during the step loop (seeded: {seeded})");
    }

    // From outside the pool: at most rayon's job blocks (2 parallel sections per step here).
    let mut marks = Marks::default();
    sampler.generate(&mut model, &[1, 2, 3], &cfg, &mut SeededRng::new(5), &mut marks).unwrap();
    let end = ALLOCATIONS.load(Ordering::SeqCst);
    // Rayon's job blocks, plus the one-time registration of each global-pool thread.
    let (parallel_sections, threads) = (2 * marks.steps, rayon::current_num_threads());
    let allocations = end - marks.after_first_step.unwrap();
    assert!(allocations <= 1 + parallel_sections / 63 + threads, "{allocations} allocations");
}
