//! The server's counters and histograms, rendered in Prometheus' text format for `GET /metrics`:
//! requests by endpoint and status, queue depth, running requests, prompt, reused and generated tokens, steps per
//! canvas, tokens per forward, prefill, step and first-canvas latency, cancellations, engine
//! panics, and the KV-cache pool (bytes, entries, budget, hits, misses, evictions).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Bucket bounds for latencies in seconds: 0.5 ms to 30 s.
const SECONDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Bucket bounds for decoder passes per canvas.
const STEPS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0];
/// Bucket bounds for tokens per forward.
const PER_FORWARD: &[f64] = &[0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// A cumulative histogram with fixed bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Counts per bucket (the last is +Inf), the sum and the count.
    state: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, state: Mutex::new((vec![0; bounds.len() + 1], 0.0, 0)) }
    }

    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0[bucket] += 1;
        s.1 += value;
        s.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in s.0.iter().enumerate() {
            cumulative += count;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", s.1, s.2);
    }
}

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub queue_depth: AtomicI64,
    /// Jobs generating now (at most `--batch`).
    pub running: AtomicI64,
    pub prompt_tokens: AtomicU64,
    pub reused_prompt_tokens: AtomicU64,
    /// Prompt tokens of typed reads, and of those the ones the read slot's cache held already.
    pub read_prompt_tokens: AtomicU64,
    pub read_reused_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    pub engine_panics: AtomicU64,
    pub pool_bytes: AtomicU64,
    pub pool_entries: AtomicU64,
    pub pool_budget_bytes: AtomicU64,
    pub cache_hits_resident: AtomicU64,
    pub cache_hits_pool: AtomicU64,
    pub cache_misses: AtomicU64,
    pub pool_evictions: AtomicU64,
    pub steps_per_canvas: Histogram,
    pub tokens_per_forward: Histogram,
    pub prefill_seconds: Histogram,
    pub step_seconds: Histogram,
    pub first_canvas_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            queue_depth: AtomicI64::new(0),
            running: AtomicI64::new(0),
            prompt_tokens: AtomicU64::new(0),
            reused_prompt_tokens: AtomicU64::new(0),
            read_prompt_tokens: AtomicU64::new(0),
            read_reused_prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            engine_panics: AtomicU64::new(0),
            pool_bytes: AtomicU64::new(0),
            pool_entries: AtomicU64::new(0),
            pool_budget_bytes: AtomicU64::new(0),
            cache_hits_resident: AtomicU64::new(0),
            cache_hits_pool: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            pool_evictions: AtomicU64::new(0),
            steps_per_canvas: Histogram::new(STEPS),
            tokens_per_forward: Histogram::new(PER_FORWARD),
            prefill_seconds: Histogram::new(SECONDS),
            step_seconds: Histogram::new(SECONDS),
            first_canvas_seconds: Histogram::new(SECONDS),
        }
    }
}

impl Metrics {
    /// Counts the prompt tokens of a request's typed reads: those made the model's cache, and of
    /// those the ones a cache held already.
    pub fn reads(&self, prompt_tokens: usize, reused_tokens: usize) {
        self.read_prompt_tokens.fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.read_reused_prompt_tokens.fetch_add(reused_tokens as u64, Ordering::Relaxed);
    }

    /// Counts one answered request.
    pub fn request(&self, endpoint: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP dg_requests_total HTTP requests answered, by endpoint and status.\n# TYPE dg_requests_total counter\n");
        for ((endpoint, status), n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "dg_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}");
        }
        let gauge = |out: &mut String, name: &str, help: &str, v: i64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let counter = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        };
        gauge(&mut out, "dg_queue_depth", "Generation requests waiting for the engine.", self.queue_depth.load(Ordering::Relaxed));
        gauge(&mut out, "dg_running", "Generation requests generating now (at most --batch).", self.running.load(Ordering::Relaxed));
        counter(&mut out, "dg_prompt_tokens_total", "Prompt tokens of generation requests.", &self.prompt_tokens);
        counter(
            &mut out,
            "dg_reused_prompt_tokens_total",
            "Prompt tokens found in the KV cache and not encoded again.",
            &self.reused_prompt_tokens,
        );
        counter(
            &mut out,
            "dg_read_prompt_tokens_total",
            "Prompt tokens of typed reads (/v1/systemone, vLLM's read-only requests).",
            &self.read_prompt_tokens,
        );
        counter(
            &mut out,
            "dg_read_reused_prompt_tokens_total",
            "Prompt tokens of typed reads found in the read cache (a shared prefix: the system text, a re-read's state) and not encoded again.",
            &self.read_reused_prompt_tokens,
        );
        counter(&mut out, "dg_generated_tokens_total", "Completion tokens returned.", &self.generated_tokens);
        counter(
            &mut out,
            "dg_cancelled_total",
            "Generations stopped before their text was final: the client left, or the shutdown's deadline passed.",
            &self.cancelled,
        );
        counter(
            &mut out,
            "dg_engine_panics_total",
            "Generations that panicked (answered 500; the engine kept serving).",
            &self.engine_panics,
        );
        let pool_gauges = [
            ("dg_cache_pool_bytes", "Bytes of the KV caches kept in the pool (besides the model's own).", &self.pool_bytes),
            ("dg_cache_pool_entries", "KV caches kept in the pool.", &self.pool_entries),
            ("dg_cache_pool_budget_bytes", "The pool's byte budget (--cache-budget).", &self.pool_budget_bytes),
        ];
        for (name, help, v) in pool_gauges {
            gauge(&mut out, name, help, v.load(Ordering::Relaxed) as i64);
        }
        out.push_str(
            "# HELP dg_cache_hits_total Generations that continued from a KV cache: the model's own (resident) or one from the pool.\n\
             # TYPE dg_cache_hits_total counter\n",
        );
        for (cache, v) in [("resident", &self.cache_hits_resident), ("pool", &self.cache_hits_pool)] {
            let _ = writeln!(out, "dg_cache_hits_total{{cache=\"{cache}\"}} {}", v.load(Ordering::Relaxed));
        }
        counter(&mut out, "dg_cache_misses_total", "Generations whose prompt extends no kept KV cache.", &self.cache_misses);
        counter(
            &mut out,
            "dg_cache_pool_evictions_total",
            "KV caches dropped from the pool (least recently used first) to stay within the budget, or not kept at all.",
            &self.pool_evictions,
        );
        self.steps_per_canvas.render(&mut out, "dg_steps_per_canvas", "Decoder passes per committed canvas.");
        self.tokens_per_forward.render(&mut out, "dg_tokens_per_forward", "Valid tokens per decoder pass, per generation.");
        self.prefill_seconds.render(&mut out, "dg_prefill_seconds", "Prompt encode time per generation.");
        self.step_seconds.render(&mut out, "dg_step_seconds", "Denoising step time (canvas forward and per-row work; with --batch above 1, one step of every running request, their encodes included).");
        self.first_canvas_seconds.render(
            &mut out,
            "dg_first_canvas_seconds",
            "From the engine taking a request to its first committed canvas.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_requests_labelled() {
        let m = Metrics::default();
        m.steps_per_canvas.observe(3.0);
        m.steps_per_canvas.observe(100.0);
        m.request("/health", 200);
        m.request("/health", 200);
        let text = m.render();
        assert!(text.contains("dg_steps_per_canvas_bucket{le=\"2\"} 0"), "{text}");
        assert!(text.contains("dg_steps_per_canvas_bucket{le=\"4\"} 1"), "{text}");
        assert!(text.contains("dg_steps_per_canvas_bucket{le=\"+Inf\"} 2"), "{text}");
        assert!(text.contains("dg_steps_per_canvas_count 2"), "{text}");
        assert!(text.contains("dg_requests_total{endpoint=\"/health\",status=\"200\"} 2"), "{text}");
    }
}
