//! The server gauges the soak watches, read from its Prometheus `/metrics`: requests running
//! and waiting, KV blocks free and in all (required: the soak's pass criteria need them);
//! resident memory (`process_resident_memory_bytes`) and the allocator's heap in use
//! (`ferrum_heap_in_use_bytes`), both optional: servers other than Ferrum, or Ferrum off Linux
//! or glibc, may not export them, and then the memory check watches what there is or is
//! skipped ([`super::memory`]); whether the KV
//! cache is still being made resident (`ferrum_kv_cache_populating`, optional: a server is not
//! idle, for the memory check, while its resident size still grows to its full size); and, for
//! the report only, the prefix-cache hit (in tokens) and preemption counters.

use anyhow::{anyhow, Result};
use std::time::{Duration, Instant};

/// One reading of the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gauges {
    pub running: f64,
    pub waiting: f64,
    pub blocks_total: f64,
    pub blocks_free: f64,
    pub rss_bytes: Option<f64>,
    pub heap_bytes: Option<f64>,
    pub populating: Option<f64>,
    pub prefix_cache_hits: Option<f64>,
    pub preemptions: Option<f64>,
}

impl Gauges {
    /// Nothing running or waiting, every KV block free, and the KV cache resident.
    pub fn is_idle(&self) -> bool {
        self.running == 0.0
            && self.waiting == 0.0
            && self.blocks_free == self.blocks_total
            && self.populating.unwrap_or(0.0) == 0.0
    }
}

/// The value of the first sample of metric `name` (labelled or not) in a Prometheus text page.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The gauges in a `/metrics` page; `what` names the page in errors.
pub fn parse(text: &str, what: &str) -> Result<Gauges> {
    let need = |name: &str| sample(text, name).ok_or_else(|| anyhow!("{what} has no {name}"));
    Ok(Gauges {
        running: need("ferrum_num_requests_running")?,
        waiting: need("ferrum_num_requests_waiting")?,
        blocks_total: need("ferrum_kv_blocks_total")?,
        blocks_free: need("ferrum_kv_blocks_free")?,
        rss_bytes: sample(text, "process_resident_memory_bytes"),
        heap_bytes: sample(text, "ferrum_heap_in_use_bytes"),
        populating: sample(text, "ferrum_kv_cache_populating"),
        prefix_cache_hits: sample(text, "ferrum_prefix_cache_hits_total"),
        preemptions: sample(text, "ferrum_num_preemptions_total"),
    })
}

/// Reads the gauges from `{base}/metrics`.
pub async fn read(c: &reqwest::Client, base: &str) -> Result<Gauges> {
    let what = format!("{base}/metrics");
    let text = c
        .get(&what)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| anyhow!("GET {what}: {e}"))?
        .text()
        .await
        .map_err(|e| anyhow!("GET {what}: {e}"))?;
    parse(&text, &what)
}

/// Polls until the server is idle or `within` has passed; the last reading, and whether it
/// was idle.
pub async fn settle(c: &reqwest::Client, base: &str, within: Duration) -> Result<(Gauges, bool)> {
    let deadline = Instant::now() + within;
    loop {
        let g = read(c, base).await?;
        if g.is_idle() || Instant::now() > deadline {
            return Ok((g, g.is_idle()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_metrics_page() {
        let page = "# HELP ferrum_num_requests_running Requests.\n\
            # TYPE ferrum_num_requests_running gauge\n\
            ferrum_num_requests_running{model_name=\"a b\"} 0\n\
            ferrum_num_requests_running_total{model_name=\"a b\"} 9\n\
            ferrum_num_requests_waiting{model_name=\"a b\"} 2\n\
            ferrum_kv_blocks_total{model_name=\"a b\"} 512\n\
            ferrum_kv_blocks_free_cached{model_name=\"a b\"} 3\n\
            ferrum_kv_blocks_free{model_name=\"a b\"} 500\n\
            ferrum_prefix_cache_hits_total{model_name=\"a b\"} 7\n\
            process_resident_memory_bytes 1048576\n\
            ferrum_heap_in_use_bytes 524288\n";
        let g = parse(page, "page").expect("gauges");
        assert_eq!(
            g,
            Gauges {
                running: 0.0,
                waiting: 2.0,
                blocks_total: 512.0,
                blocks_free: 500.0,
                rss_bytes: Some(1048576.0),
                heap_bytes: Some(524288.0),
                populating: None,
                prefix_cache_hits: Some(7.0),
                preemptions: None,
            }
        );
        assert!(!g.is_idle());
        // Idle counts, and a cache still being made resident keeps a server busy.
        let idle = page
            .replace(
                "waiting{model_name=\"a b\"} 2",
                "waiting{model_name=\"a b\"} 0",
            )
            .replace(
                "free{model_name=\"a b\"} 500",
                "free{model_name=\"a b\"} 512",
            );
        assert!(parse(&idle, "page").expect("gauges").is_idle());
        let filling = format!("{idle}ferrum_kv_cache_populating{{model_name=\"a b\"}} 1\n");
        let g = parse(&filling, "page").expect("gauges");
        assert_eq!(g.populating, Some(1.0));
        assert!(!g.is_idle());
        let filled = filling.replace(
            "populating{model_name=\"a b\"} 1",
            "populating{model_name=\"a b\"} 0",
        );
        assert!(parse(&filled, "page").expect("gauges").is_idle());
        let no_rss = page.replace("process_resident_memory_bytes 1048576\n", "");
        assert_eq!(parse(&no_rss, "page").expect("gauges").rss_bytes, None);
        let no_kv = page.replace("ferrum_kv_blocks_free{", "other{");
        let err = parse(&no_kv, "page").expect_err("no free blocks gauge");
        assert!(err.to_string().contains("ferrum_kv_blocks_free"), "{err}");
    }
}
