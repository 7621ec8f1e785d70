//! Decode steps as CUDA graphs: the key a graph is captured for, when a step captures, replays
//! or runs plainly, and the logits rows a captured step ends with.
//!
//! Invariants: a bucket's first step runs plainly (sizing every buffer its capture will hold),
//! the second captures, later ones replay; any address a graph holds besides weights and KV
//! changing drops every graph.

use super::*;

/// What a graph was captured for: the padded batch size, each rope's frequency set (LongRoPE's
/// long or short), and the KV cache it reads and writes (every layer's addresses, an fp8
/// cache's scales' included, its block
/// size and type: a cache freed and another allocated in its place must not match unless all
/// of them do).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct GraphKey {
    pub(super) tokens: usize,
    pub(super) long: Vec<bool>,
    pub(super) kv: Vec<crate::kv_cache::DeviceKvLayer>,
    /// The cache's block size and element type (launch arguments and kernel choice).
    pub(super) block_size: usize,
    pub(super) kv_dtype: &'static str,
    /// The split-K attention's grid depth (a power of two; 1 without splits), its keys per
    /// range, and how decode products split (launch arguments and grids).
    pub(super) splits: usize,
    pub(super) split_keys: usize,
    pub(super) decode_split: DecodeSplit,
}

/// The decode graphs of one backend.
#[derive(Debug, Default)]
pub(super) struct Graphs {
    pub(super) mode: CudaGraphs,
    pub(super) captured: HashMap<GraphKey, GraphId>,
    /// Keys whose first step ran plainly (the capture comes on the second).
    pub(super) seen: HashSet<GraphKey>,
    /// Keys the driver could not make a graph of: they run plainly.
    pub(super) refused: HashSet<GraphKey>,
    /// Every address the graphs hold besides weights and KV; a change drops them all.
    pub(super) addresses: Vec<DevicePtr>,
    /// This step's padded size, when it is a decode batch that pads to a bucket.
    pub(super) bucket: Option<usize>,
    /// This step's graph: being captured, or replayed.
    pub(super) step: Option<(GraphKey, GraphStep)>,
    /// Steps replayed and graphs captured, for tests and the benchmark.
    pub(super) replays: u64,
    pub(super) captures: u64,
}

impl CudaBackend {
    /// Decode steps replayed from a graph, and graphs captured, so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        (self.graphs.replays, self.graphs.captures)
    }

    /// Every address a captured graph holds besides the weights and the KV cache.
    pub(super) fn graph_addresses(&self) -> Vec<DevicePtr> {
        let grown = self
            .bufs
            .iter()
            .chain([
                &self.normed,
                &self.rows,
                &self.logits,
                &self.indices,
                &self.attn_part,
                &self.gemm_part,
                &self.split_counts,
                &self.vendor.half,
            ])
            .map(|g| g.buf.as_ref().map_or(DevicePtr::NULL, DeviceBuffer::ptr));
        let ropes = self.inv_freq.iter().flat_map(|u| {
            [
                u.short.0.ptr(),
                u.long.as_ref().map_or(DevicePtr::NULL, |l| l.0.ptr()),
            ]
        });
        let scratch = self.gpu.lock().scratch_ptr();
        grown.chain(ropes).chain([scratch]).collect()
    }

    /// Drops every captured graph (each one, even after a failure; the first error is
    /// returned) and forgets which keys were seen or refused.
    pub(super) fn drop_graphs(&mut self) -> Result<()> {
        let mut gpu = self.gpu.lock();
        let mut first = Ok(());
        for (_, g) in self.graphs.captured.drain() {
            if let (Err(e), Ok(())) = (gpu.drop_graph(g), &first) {
                first = Err(e.into());
            }
        }
        self.graphs.seen.clear();
        self.graphs.refused.clear();
        first
    }

    /// The padded size of `batch` when it is a decode batch that fits a bucket.
    pub(super) fn bucket(&self, batch: &ForwardBatch) -> Option<usize> {
        let t = batch.num_tokens();
        let decode = t > 0
            && batch.seqs.len() == t
            && batch.seqs.iter().all(|s| s.query_len == 1)
            && batch.logits_indices.len() == t
            && batch
                .logits_indices
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i);
        if self.graphs.mode == CudaGraphs::Off || !decode {
            return None;
        }
        GRAPH_BUCKETS.iter().copied().find(|&b| b >= t)
    }

    /// The step's logits on the device, `[device_rows, vocab]` (the first `n` rows the
    /// batch's): the captured graph ended and replayed, the graph replayed, or the head's
    /// launches issued.
    pub(super) fn step_logits(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        n: usize,
    ) -> Result<()> {
        match self.graphs.step.take() {
            Some((key, GraphStep::Capture)) => {
                let captured = self.device_logits(norm, eps, head, self.device_rows);
                let graph = match captured {
                    Ok(()) => self.gpu.lock().end_capture()?,
                    Err(e) => {
                        self.gpu.lock().abort_capture();
                        return Err(e);
                    }
                };
                match graph {
                    Some(graph) => {
                        self.graphs.captured.insert(key, graph);
                        self.graphs.captures += 1;
                        self.gpu.lock().replay(graph)?;
                    }
                    // No graph could be made: the launches ran plainly; so will this key's.
                    None => {
                        self.graphs.refused.insert(key);
                    }
                }
            }
            Some((key, GraphStep::Replay)) => {
                let graph = self.graphs.captured.get(&key).copied().ok_or_else(|| {
                    ModelError::Invalid("the step's graph was dropped before its replay".into())
                })?;
                self.gpu.lock().replay(graph)?;
                self.graphs.replays += 1;
            }
            _ if n == 0 => {}
            // A padded bucket's first step computes every row its capture will, so the
            // capture finds every buffer and scratch area sized.
            _ => self.device_logits(norm, eps, head, self.device_rows.max(n))?,
        }
        Ok(())
    }

    /// The logits of the first `n` rows of the rows index: gather, norm, head product.
    pub(super) fn device_logits(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        n: usize,
    ) -> Result<()> {
        let h = self.dims.hidden;
        let r = self.rows.ptr()?;
        let grid = [
            n as u32,
            cdiv(h, self.block("gather_rows_f32", "BLOCK")?),
            1,
        ];
        let args = args![
            table_ptr: p(self.buf(Buf::X)?),
            ids_ptr: p(self.index(self.at.rows)?),
            out_ptr: p(r),
            n_cols: i32_arg(h, "hidden size")?,
            table_stride: i32_arg(h, "row stride")?,
            out_stride: i32_arg(h, "row stride")?,
            scale: KernelArg::F32(1.0),
        ];
        self.launch("gather_rows_f32", grid, &args)?;
        self.rms_norm(r, None, r, norm, n, 1, h, eps)?;
        self.gemm((r, h), head, (self.logits.ptr()?, head.rows), n)
    }

    pub(super) fn graph_step_impl(&mut self, kv: &KvCache) -> Result<GraphStep> {
        let Some(tokens) = self.graphs.bucket else {
            return Ok(GraphStep::Plain);
        };
        // Each rope must take one frequency set for the whole batch (LongRoPE can split one).
        let mut long = Vec::with_capacity(self.rope_runs.len());
        for runs in &self.rope_runs {
            match runs.as_slice() {
                [(_, _, l)] => long.push(*l),
                _ => return Ok(GraphStep::Plain),
            }
        }
        let mut layers = Vec::with_capacity(kv.num_layers());
        for l in 0..kv.num_layers() {
            layers.push(kv.device_layer(l)?);
        }
        let key = GraphKey {
            tokens,
            long,
            kv: layers,
            block_size: kv.block_size(),
            kv_dtype: kv.dtype().name(),
            splits: self.attn_splits,
            split_keys: self.split_keys,
            decode_split: self.decode_split,
        };
        if self.graphs.refused.contains(&key) {
            return Ok(GraphStep::Plain);
        }
        let addresses = self.graph_addresses();
        if addresses != self.graphs.addresses {
            self.drop_graphs()?;
            self.graphs.addresses = addresses;
        }
        if self.graphs.captured.contains_key(&key) {
            self.graphs.step = Some((key, GraphStep::Replay));
            return Ok(GraphStep::Replay);
        }
        // The first step of a shape runs plainly: it sizes every buffer and scratch area the
        // capture will hold.
        if self.graphs.seen.insert(key.clone()) {
            return Ok(GraphStep::Plain);
        }
        self.gpu.lock().begin_capture()?;
        self.graphs.step = Some((key, GraphStep::Capture));
        Ok(GraphStep::Capture)
    }
}
