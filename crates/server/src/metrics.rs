//! The engine's [`Metrics`] as Prometheus text (exposition format 0.0.4), every series
//! labelled with the served model name as vLLM does; plus, on Linux, Prometheus' standard
//! unlabelled `process_resident_memory_bytes`, and with glibc's allocator the unlabelled
//! `ferrum_heap_in_use_bytes` (what the allocator has handed out and not taken back), each read
//! at each scrape and left out where the platform does not report it. Resident memory also
//! grows when the allocator makes an arena or keeps freed pages; the heap in use grows only with
//! live allocations, so a leak shows in it plainly (`ferrum bench soak` watches it).

use ferrum_engine::metrics::Histogram;
use ferrum_engine::Metrics;
use std::fmt::Write;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
    labels: String,
}

impl Out {
    fn metric(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
        let _ = writeln!(self.text, "{name}{{{}}} {value}", self.labels);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} histogram");
        let mut cum = 0u64;
        for (i, c) in h.counts.iter().enumerate() {
            cum += c;
            let le = h
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                self.text,
                "{name}_bucket{{{},le=\"{le}\"}} {cum}",
                self.labels
            );
        }
        let _ = writeln!(self.text, "{name}_sum{{{}}} {}", self.labels, h.sum);
        let _ = writeln!(self.text, "{name}_count{{{}}} {}", self.labels, h.count);
    }
}

/// The KV tiers' series (`--kv-offload-memory`, `--kv-disk-dir`), one per tier that is on,
/// labelled `tier="host"` or `tier="disk"`.
fn kv_tiers(o: &mut Out, m: &Metrics) {
    let tiers: Vec<(&str, &ferrum_engine::TierCounters)> =
        [("host", &m.kv_host), ("disk", &m.kv_disk)]
            .into_iter()
            .filter(|(_, c)| c.enabled)
            .collect();
    if tiers.is_empty() {
        return;
    }
    type Read = fn(&ferrum_engine::TierCounters) -> f64;
    let series: [(&str, &str, &str, Read); 11] = [
        (
            "ferrum_kv_tier_hits_total",
            "counter",
            "KV blocks brought back from a tier instead of recomputed.",
            |d| d.hits as f64,
        ),
        (
            "ferrum_kv_tier_misses_total",
            "counter",
            "KV blocks of prompt prefixes missing from the pool that the tier did not have either.",
            |d| d.misses as f64,
        ),
        (
            "ferrum_kv_tier_read_bytes_total",
            "counter",
            "Bytes of K/V brought back from a tier.",
            |d| d.bytes_read as f64,
        ),
        (
            "ferrum_kv_tier_written_bytes_total",
            "counter",
            "Bytes of K/V handed to a tier to keep.",
            |d| d.bytes_written as f64,
        ),
        (
            "ferrum_kv_tier_bad_files_total",
            "counter",
            "Block files found truncated, corrupt or foreign: ignored, deleted and recomputed.",
            |d| d.bad_files as f64,
        ),
        (
            "ferrum_kv_tier_write_failures_total",
            "counter",
            "Block copies or writes that failed (disk writes stop after the first).",
            |d| d.write_failures as f64,
        ),
        (
            "ferrum_kv_tier_evictions_total",
            "counter",
            "Blocks a tier let go to stay within its size.",
            |d| d.evictions as f64,
        ),
        (
            "ferrum_kv_tier_read_seconds_total",
            "counter",
            "Seconds spent reading and checking blocks.",
            |d| d.read_seconds,
        ),
        (
            "ferrum_kv_tier_wait_seconds_total",
            "counter",
            "Seconds requests waited for their blocks before they were scheduled.",
            |d| d.wait_seconds,
        ),
        (
            "ferrum_kv_tier_blocks",
            "gauge",
            "KV blocks a tier holds.",
            |d| d.blocks as f64,
        ),
        (
            "ferrum_kv_tier_bytes",
            "gauge",
            "Bytes a tier holds.",
            |d| d.bytes as f64,
        ),
    ];
    for (name, kind, help, read) in series {
        let _ = writeln!(o.text, "# HELP {name} {help}");
        let _ = writeln!(o.text, "# TYPE {name} {kind}");
        for (tier, c) in &tiers {
            let _ = writeln!(o.text, "{name}{{{},tier=\"{tier}\"}} {}", o.labels, read(c));
        }
    }
}

/// Renders `m` for a scrape.
pub fn render(m: &Metrics, model_name: &str) -> String {
    let mut o = Out {
        text: String::with_capacity(8192),
        labels: format!("model_name=\"{}\"", label(model_name)),
    };
    let used = m.kv_blocks_total.saturating_sub(m.kv_blocks_free);
    let usage = if m.kv_blocks_total == 0 {
        0.0
    } else {
        used as f64 / m.kv_blocks_total as f64
    };
    let _ = writeln!(
        o.text,
        "# HELP ferrum_device_info The device the model runs on.\n\
         # TYPE ferrum_device_info gauge\n\
         ferrum_device_info{{{},device=\"{}\"}} 1",
        o.labels,
        label(&m.device)
    );
    o.metric(
        "ferrum_num_requests_running",
        "gauge",
        "Sequences in the running batch.",
        m.num_running as f64,
    );
    o.metric(
        "ferrum_num_requests_waiting",
        "gauge",
        "Sequences waiting to be scheduled.",
        m.num_waiting as f64,
    );
    o.metric(
        "ferrum_kv_blocks_total",
        "gauge",
        "KV cache blocks in the pool.",
        m.kv_blocks_total as f64,
    );
    o.metric(
        "ferrum_kv_blocks_free",
        "gauge",
        "KV cache blocks held by no sequence (cached prefixes included).",
        m.kv_blocks_free as f64,
    );
    o.metric(
        "ferrum_kv_blocks_cached",
        "gauge",
        "Free KV cache blocks that still hold a reusable prefix.",
        m.kv_blocks_cached as f64,
    );
    o.metric(
        "ferrum_kv_cache_populating",
        "gauge",
        "1 while part of the KV cache is still being made resident (done while idle).",
        if m.kv_cache_populating { 1.0 } else { 0.0 },
    );
    o.metric(
        "ferrum_kv_cache_usage_perc",
        "gauge",
        "Fraction of KV cache blocks held by sequences (1 means full).",
        usage,
    );
    let counters = [
        (
            "ferrum_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache (each sequence at admission).",
            m.prefix_cache_queries,
        ),
        (
            "ferrum_prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            m.prefix_cache_hits,
        ),
        (
            "ferrum_num_preemptions_total",
            "Sequences preempted for lack of KV blocks.",
            m.preemptions,
        ),
        (
            "ferrum_prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            m.prompt_tokens,
        ),
        (
            "ferrum_generation_tokens_total",
            "Tokens generated.",
            m.generation_tokens,
        ),
        (
            "ferrum_request_success_total",
            "Requests finished (aborted ones included).",
            m.requests_finished,
        ),
        (
            "ferrum_spec_decode_num_drafts_total",
            "Speculative decoding: runs that verified proposed tokens.",
            m.spec.num_drafts,
        ),
        (
            "ferrum_spec_decode_num_draft_tokens_total",
            "Speculative decoding: tokens proposed and verified.",
            m.spec.num_draft_tokens,
        ),
        (
            "ferrum_spec_decode_num_accepted_tokens_total",
            "Speculative decoding: proposed tokens accepted.",
            m.spec.num_accepted_tokens,
        ),
        (
            "ferrum_spec_decode_draft_forwards_total",
            "Speculative decoding: forward passes of the draft model.",
            m.spec.draft_forwards,
        ),
    ];
    for (name, help, v) in counters {
        o.metric(name, "counter", help, v as f64);
    }
    kv_tiers(&mut o, m);
    let cost = [
        (
            "ferrum_cost_step_seconds",
            "Fitted seconds a step costs, whatever it computes.",
        ),
        (
            "ferrum_cost_prefill_token_seconds",
            "Fitted seconds per prefill token in a step.",
        ),
        (
            "ferrum_cost_decode_row_seconds",
            "Fitted seconds per decode row in a step.",
        ),
        (
            "ferrum_cost_kv_block_seconds",
            "Fitted seconds per KV block attention reads in a step.",
        ),
    ];
    for ((name, help), v) in cost.into_iter().zip(m.cost) {
        o.metric(name, "gauge", help, v);
    }
    if !m.tenant_computed_tokens.is_empty() {
        let name = "ferrum_tenant_computed_tokens_total";
        let _ = writeln!(
            o.text,
            "# HELP {name} Tokens computed (prompt and output) for each tenant (`user`; the first 64 named, weighted ones first)."
        );
        let _ = writeln!(o.text, "# TYPE {name} counter");
        for (tenant, n) in &m.tenant_computed_tokens {
            let _ = writeln!(
                o.text,
                "{name}{{{},tenant=\"{}\"}} {n}",
                o.labels,
                label(tenant)
            );
        }
    }
    if let Some(s) = m.calibration_seconds {
        o.metric(
            "ferrum_cost_calibration_seconds",
            "gauge",
            "Seconds the step cost model's calibration at start took.",
            s,
        );
    }
    o.metric(
        "ferrum_cost_margin",
        "gauge",
        "Factor on a predicted step time that steps planned within a time-per-output-token \
         target are held to (1 + the predictions' mean relative error + its deviation).",
        m.cost_margin,
    );
    o.metric(
        "ferrum_ttft_observed_over_predicted",
        "gauge",
        "Admission's record of itself: the median ratio of observed to predicted first tokens \
         of recent admitted requests with a target, over predictions of at least a quarter of \
         their target (1 until 8 are seen).",
        m.ttft_ratio,
    );
    o.metric(
        "ferrum_ttft_predictions_observed_total",
        "counter",
        "Admitted requests whose predicted first token was compared with the observed one.",
        m.ttft_observed as f64,
    );
    o.metric(
        "ferrum_cost_model_ready",
        "gauge",
        "1 once the step cost model has seen enough steps to refuse requests on its word.",
        if m.cost_ready { 1.0 } else { 0.0 },
    );
    o.metric(
        "ferrum_step_prefill_cap_tokens",
        "gauge",
        "Prefill tokens a step may take: the last step's, so its decodes keep their \
         time-per-output-token targets and it keeps to the step limit, or, with nothing \
         decoding, what the step limit allows (-1: no target or limit applies).",
        m.prefill_cap.map_or(-1.0, |c| c as f64),
    );
    o.metric(
        "ferrum_step_limit_seconds",
        "gauge",
        "The longest a step is planned under slo scheduling: a share of the tightest \
         first-token target seen in the last minute (-1: no limit).",
        m.step_limit.unwrap_or(-1.0),
    );
    o.metric(
        "ferrum_pending_prefill_tokens",
        "gauge",
        "Prompt tokens still to be computed (what a new request's first token waits behind).",
        m.pending_prefill_tokens as f64,
    );
    o.metric(
        "ferrum_engine_steps_total",
        "counter",
        "Engine steps run.",
        m.steps as f64,
    );
    o.metric(
        "ferrum_engine_steps_overlapped_total",
        "counter",
        "Steps left running on the GPU while the next step was scheduled and enqueued.",
        m.steps_overlapped as f64,
    );
    o.metric(
        "ferrum_engine_step_seconds_total",
        "counter",
        "Seconds the engine loop spent in steps.",
        m.step_seconds,
    );
    o.metric(
        "ferrum_engine_device_wait_seconds_total",
        "counter",
        "Seconds of steps spent waiting for an overlapped step's results from the GPU.",
        m.device_wait_seconds,
    );
    o.metric(
        "ferrum_structured_output_masks_total",
        "counter",
        "Structured output: token masks computed.",
        m.structured_masks as f64,
    );
    o.metric(
        "ferrum_structured_output_mask_seconds_total",
        "counter",
        "Structured output: seconds spent computing token masks (mostly overlapped with forward passes).",
        m.structured_mask_seconds,
    );
    o.metric(
        "ferrum_structured_output_mask_wait_seconds_total",
        "counter",
        "Structured output: seconds steps waited for masks after their forward pass.",
        m.structured_mask_wait_seconds,
    );
    let per_pos = "ferrum_spec_decode_num_accepted_tokens_per_pos_total";
    let _ = writeln!(
        o.text,
        "# HELP {per_pos} Speculative decoding: runs whose proposal at this position (0-based) was accepted."
    );
    let _ = writeln!(o.text, "# TYPE {per_pos} counter");
    for (i, c) in m.spec.accepted_per_pos.iter().enumerate() {
        let _ = writeln!(o.text, "{per_pos}{{{},position=\"{i}\"}} {c}", o.labels);
    }
    o.histogram(
        "ferrum_time_to_first_token_seconds",
        "Time from arrival to the first generated token.",
        &m.time_to_first_token,
    );
    o.histogram(
        "ferrum_inter_token_latency_seconds",
        "Time between consecutive tokens of a sequence.",
        &m.inter_token_latency,
    );
    o.histogram(
        "ferrum_e2e_request_latency_seconds",
        "Time from arrival to the end of a request.",
        &m.e2e_latency,
    );
    // Process-wide, so unlabelled (the first is Prometheus' standard process metric); each
    // left out where the platform does not report it.
    let process = [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            resident_bytes(),
        ),
        (
            "ferrum_heap_in_use_bytes",
            "Bytes allocated and not yet freed (glibc mallinfo2).",
            heap_in_use_bytes(),
        ),
    ];
    for (name, help, value) in process {
        if let Some(v) = value {
            let _ = writeln!(o.text, "# HELP {name} {help}");
            let _ = writeln!(o.text, "# TYPE {name} gauge");
            let _ = writeln!(o.text, "{name} {v}");
        }
    }
    o.text
}

/// The bytes glibc's allocator has handed out and not taken back: in-use chunks of every arena
/// plus chunks of their own mapping (`mallinfo2`'s `uordblks + hblkhd`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_in_use_bytes() -> Option<u64> {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    u64::try_from(m.uordblks.saturating_add(m.hblkhd)).ok()
}

/// Not reported without glibc's allocator.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_in_use_bytes() -> Option<u64> {
    None
}

/// A `Key:   123 kB` field of a /proc file, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn proc_kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// This process's resident memory: `Rss` of /proc/self/smaps_rollup, else `VmRSS` of
/// /proc/self/status (kernels before 4.14).
#[cfg(target_os = "linux")]
pub fn resident_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|t| proc_kib_field(&t, "Rss:"))
        .or_else(|| {
            let t = std::fs::read_to_string("/proc/self/status").ok()?;
            proc_kib_field(&t, "VmRSS:")
        })
}

/// This process's resident memory: not reported off Linux.
#[cfg(not(target_os = "linux"))]
pub fn resident_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that allocate a large block or compare two memory readings, so that
    /// neither sees the other's block come or go.
    static MEMORY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn exposition_format() {
        let mut m = Metrics {
            kv_blocks_total: 10,
            kv_blocks_free: 7,
            ..Metrics::default()
        };
        m.time_to_first_token.observe(0.003);
        m.time_to_first_token.observe(100.0);
        m.spec.record(4, 2);
        m.spec.record(3, 0);
        let t = render(&m, "a\"b");
        assert!(t.contains("ferrum_spec_decode_num_drafts_total{model_name=\"a\\\"b\"} 2\n"));
        assert!(t.contains("ferrum_spec_decode_num_draft_tokens_total{model_name=\"a\\\"b\"} 7\n"));
        assert!(t.contains(
            "ferrum_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"a\\\"b\",position=\"1\"} 1\n"
        ));
        assert!(t.contains("ferrum_kv_blocks_total{model_name=\"a\\\"b\"} 10\n"));
        assert!(t.contains("ferrum_device_info{model_name=\"a\\\"b\",device=\"cpu\"} 1\n"));
        assert!(t.contains("ferrum_kv_blocks_free{model_name=\"a\\\"b\"} 7\n"));
        assert!(t.contains("ferrum_kv_cache_usage_perc{model_name=\"a\\\"b\"} 0.3\n"));
        assert!(t.contains(
            "ferrum_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"0.005\"} 1\n"
        ));
        assert!(t.contains(
            "ferrum_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 2\n"
        ));
        assert!(t.contains("ferrum_time_to_first_token_seconds_count{model_name=\"a\\\"b\"} 2\n"));
        #[cfg(target_os = "linux")]
        {
            let rss = t
                .lines()
                .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap();
            // A test process holds more than a megabyte and less than the machine.
            assert!(rss > 1 << 20 && rss < 1 << 40, "{rss}");
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            let heap = |t: &str| {
                t.lines()
                    .find_map(|l| l.strip_prefix("ferrum_heap_in_use_bytes "))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap()
            };
            // While this test holds 64 MiB, at least that much is in use.
            let _alone = MEMORY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
            assert!(heap(&t) > 0);
            let held = vec![1u8; 64 << 20];
            let heap_held = heap(&render(&m, "a"));
            assert!((64 << 20..1 << 40).contains(&heap_held), "{heap_held}");
            assert_eq!(held.len(), 64 << 20);
        }
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }

    /// Each tier that is on has one series per family, under one HELP and TYPE.
    #[test]
    fn kv_tiers_share_their_families() {
        let mut m = Metrics::default();
        assert!(!render(&m, "x").contains("ferrum_kv_tier_"));
        m.kv_host.enabled = true;
        m.kv_host.hits = 3;
        let t = render(&m, "x");
        assert!(t.contains("ferrum_kv_tier_hits_total{model_name=\"x\",tier=\"host\"} 3\n"));
        assert!(!t.contains("tier=\"disk\""));
        m.kv_disk.enabled = true;
        m.kv_disk.bad_files = 2;
        let t = render(&m, "x");
        assert!(t.contains("ferrum_kv_tier_bad_files_total{model_name=\"x\",tier=\"disk\"} 2\n"));
        assert!(t.contains("ferrum_kv_tier_bad_files_total{model_name=\"x\",tier=\"host\"} 0\n"));
        assert_eq!(
            t.matches("# TYPE ferrum_kv_tier_hits_total counter")
                .count(),
            1
        );
        assert_eq!(t.matches("# TYPE ferrum_kv_tier_bytes gauge").count(), 1);
    }

    #[test]
    fn resident_memory_from_proc() {
        let rollup = "55d0c0a3e000-7ffd1a5f7000 ---p 00000000 00:00 0    [rollup]\n\
            Rss:               12345 kB\n\
            Pss:               10000 kB\n";
        assert_eq!(proc_kib_field(rollup, "Rss:"), Some(12345 * 1024));
        assert_eq!(proc_kib_field(rollup, "Swap:"), None);
        let status = "Name:\tferrum\nVmRSS:\t    2048 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(proc_kib_field(status, "VmRSS:"), Some(2 << 20));
        assert_eq!(proc_kib_field("Rss: lots kB\n", "Rss:"), None);
        assert_eq!(proc_kib_field("Rss: 18446744073709551615 kB", "Rss:"), None);
        #[cfg(target_os = "linux")]
        {
            // No other test of this binary allocates or frees a large block meanwhile.
            let _alone = MEMORY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
            let before = resident_bytes().unwrap();
            // Touch 64 MiB: resident memory follows.
            let held = vec![1u8; 64 << 20];
            let after = resident_bytes().unwrap();
            assert!(held.iter().step_by(4096).all(|&b| b == 1));
            assert!(after >= before + (48 << 20), "{before} -> {after}");
        }
        #[cfg(not(target_os = "linux"))]
        assert_eq!(resident_bytes(), None);
    }
}
