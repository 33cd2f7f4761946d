//! One sampler step used directly: temperature schedule, buffers, shape errors, thread-count independence.

use dg_model::GenerationConfig;
use dg_sampler::{DrawKind, InputError, RandomSource, Replay, RowDistributions, RowStat, Sampler, SeededRng, rows};

const C: usize = 4;
const V: usize = 50;

fn raw_logits() -> Vec<f32> {
    (0..C * V).map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.25).collect()
}

fn replay(steps: usize) -> Replay {
    let mut d = vec![(DrawKind::UniformTokens, vec![1; C])];
    for _ in 0..steps {
        d.push((DrawKind::Categorical, vec![2; C]));
        d.push((DrawKind::UniformTokens, vec![3; C]));
    }
    Replay::new(d)
}

#[test]
fn step_divides_by_the_scheduled_temperature() {
    // Spec §8.3: at n = N the processor gives logits / t_max; at n = N/2, logits / ((t_max + t_min)/2).
    let cfg = GenerationConfig { max_denoising_steps: 48, ..GenerationConfig::default() };
    let raw = raw_logits();
    for (n, t) in [(48usize, 0.8f32), (24, 0.6), (1, 0.408_333_33)] {
        assert_eq!(cfg.temperature_at(n), t);
        let mut s = Sampler::new(C, V).unwrap();
        let mut r = replay(1);
        s.begin_block(&mut r).unwrap();
        assert!(s.self_conditioning().is_none());
        s.load_logits(&raw).unwrap();
        let out = s.step(&cfg, n, &mut r, 0).unwrap();
        assert_eq!(out.temperature, t);
        let sc = s.self_conditioning().unwrap();
        assert!(sc.iter().zip(&raw).all(|(p, x)| p.to_bits() == (x / t).to_bits()), "n = {n}");
        // The draft is the argmax of the scaled logits.
        for i in 0..C {
            assert_eq!(s.draft()[i], rows::argmax(&sc[i * V..(i + 1) * V]));
        }
    }
    // No schedule: T = 1 and the scaled logits are the raw ones.
    let cfg = GenerationConfig { temperature: None, ..cfg };
    let mut s = Sampler::new(C, V).unwrap();
    let mut r = replay(1);
    s.begin_block(&mut r).unwrap();
    s.load_logits(&raw).unwrap();
    assert_eq!(s.step(&cfg, 7, &mut r, 0).unwrap().temperature, 1.0);
    assert_eq!(s.self_conditioning().unwrap(), &raw[..]);
}

#[test]
fn forward_buffers_carry_the_canvas_and_self_conditioning() {
    let cfg = GenerationConfig::default();
    let mut s = Sampler::new(C, V).unwrap();
    let mut r = replay(2);
    s.begin_block(&mut r).unwrap();
    {
        let (canvas, sc, logits) = s.forward_buffers();
        assert_eq!((canvas, sc.is_none(), logits.len()), (&[1u32; C][..], true, C * V));
        logits.copy_from_slice(&raw_logits());
    }
    let out = s.step(&cfg, 48, &mut r, 0).unwrap();
    // Accepted positions hold the categorical sample (2), the others the renoise draw (3).
    let twos = s.canvas().iter().filter(|&&t| t == 2).count();
    assert_eq!(twos, out.num_accepted);
    assert!(s.canvas().iter().all(|&t| t == 2 || t == 3));
    let (_, sc, _) = s.forward_buffers();
    assert_eq!(sc.map(<[f32]>::len), Some(C * V));
    // A new block drops the self-conditioning input.
    s.begin_block(&mut Replay::new(vec![(DrawKind::UniformTokens, vec![4; C])])).unwrap();
    assert!(s.self_conditioning().is_none());
}

#[test]
fn shape_errors() {
    let mut s = Sampler::new(C, V).unwrap();
    assert_eq!(s.load_logits(&[0.0; 7]).unwrap_err(), InputError::LogitsLength { got: 7, expected: C * V, rows: C, vocab_size: V });
    assert!(s.load_logits(&[0.0; 7]).unwrap_err().to_string().contains("logits have 7 values, expected 200"));
    assert!(matches!(s.set_canvas(&[1, 2]), Err(InputError::Shape(_))));
    assert!(matches!(s.set_canvas(&[1, 2, 3, 50]), Err(InputError::TokenOutOfRange { what: "canvas", position: 3, .. })));
    s.set_canvas(&[1, 2, 3, 49]).unwrap();
    assert_eq!(s.canvas(), &[1, 2, 3, 49]);
    assert!(matches!(Sampler::new(4, 0), Err(InputError::Shape(_))));
    assert!(matches!(Sampler::new(usize::MAX, 2), Err(InputError::Shape(_))));
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (c, v) = (24, 3001);
    let raw: Vec<f32> = (0..c * v).map(|i| (((i * 2_654_435_761) >> 7) % 2000) as f32 * 0.01 - 10.0).collect();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut logits = raw.clone();
            let mut stats = vec![RowStat::default(); c];
            rows::process_rows(&mut logits, v, 0.7, &mut stats).unwrap();
            let mut sampled = vec![0u32; c];
            let d = RowDistributions::new(&logits, &stats, v);
            SeededRng::new(9).categorical(&d, &mut sampled).unwrap();
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let stat_bits: Vec<_> = stats.iter().map(|s| (s.entropy.to_bits(), s.argmax, s.max.to_bits(), s.sum.to_bits())).collect();
            (bits(&logits), stat_bits, sampled)
        })
    };
    assert!(run(1) == run(2));
    assert!(run(1) == run(3));
}
