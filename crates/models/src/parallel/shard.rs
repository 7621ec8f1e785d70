//! Which part of a model one rank of a parallel run holds: a [`Layout`] (tensor-parallel size
//! T, pipeline-parallel size P, the layers of each stage) and a rank's [`Shard`] of it.
//!
//! World rank `r` is stage `r / T`, tensor-parallel rank `r % T`: the ranks of a stage are
//! consecutive, so `mpirun`'s default placement (fill a node's slots first) keeps each
//! tensor-parallel group inside one node. World rank 0 is stage 0's first rank.
//!
//! Tensor parallel splits attention by heads (`q` rows of heads `[r*H/T, (r+1)*H/T)`, the KV
//! heads likewise; when T exceeds the KV heads each KV head is replicated on T/KV ranks, as
//! vLLM does) and the MLP by intermediate rows (each expert's, for a mixture of experts); the
//! products after them (`o`, `down`) take the same range of their input columns, so each rank's
//! output is a partial sum that one all-reduce completes. Norms, the router and biases of the
//! outputs are replicated. The embedding is replicated on every rank of the first stage (a
//! lookup reads one row per token); the LM head is split by vocabulary over the ranks of the
//! last stage (`ceil(V / T)` rows each), which gather the logits to the stage's first rank:
//! the head is a large share of a small model's weights, and replicated it would leave the
//! other ranks idle while one reads it all.

use crate::{ModelConfig, ModelError, Result};
use std::ops::Range;

/// How a run spreads a model over ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Ranks per stage, each holding a slice of every layer of the stage.
    pub tensor_parallel: usize,
    /// Stages, each holding a contiguous range of layers.
    pub pipeline_parallel: usize,
    /// Layers per stage, in order (`--pipeline-layer-split 10,14`); `None`: as even as
    /// possible, earlier stages taking the remainder.
    pub layer_split: Option<Vec<usize>>,
    /// Micro-batches a step is split into when there are several stages (about equal token
    /// counts; never more than the step's tokens).
    pub micro_batches: usize,
}

impl Layout {
    /// One process: no parallelism.
    pub fn single() -> Layout {
        Layout {
            tensor_parallel: 1,
            pipeline_parallel: 1,
            layer_split: None,
            micro_batches: 1,
        }
    }

    /// Ranks the layout needs.
    pub fn world_size(&self) -> usize {
        self.tensor_parallel * self.pipeline_parallel
    }

    /// Checks that a job of `ranks` processes is the layout's (an error telling how to launch
    /// it otherwise).
    pub fn check_world_size(&self, ranks: usize) -> Result<()> {
        if ranks == self.world_size() {
            return Ok(());
        }
        Err(ModelError::Invalid(format!(
            "{ranks} ranks were launched for --tensor-parallel-size {} x --pipeline-parallel-size {}: launch {} (mpirun -n {})",
            self.tensor_parallel,
            self.pipeline_parallel,
            self.world_size(),
            self.world_size()
        )))
    }

    /// Whether more than one rank runs the model.
    pub fn is_parallel(&self) -> bool {
        self.world_size() > 1
    }

    /// Each stage's layers, checked against a model of `num_layers` layers.
    pub fn stage_layers(&self, num_layers: usize) -> Result<Vec<Range<usize>>> {
        let p = self.pipeline_parallel;
        let bad = |m: String| Err(ModelError::Invalid(m));
        if p == 0 || self.tensor_parallel == 0 {
            return bad("the tensor- and pipeline-parallel sizes must be at least 1".into());
        }
        let counts = match &self.layer_split {
            Some(split) => {
                if split.len() != p {
                    return bad(format!(
                        "--pipeline-layer-split gives {} stages; --pipeline-parallel-size is {p}",
                        split.len()
                    ));
                }
                if split.contains(&0) || split.iter().sum::<usize>() != num_layers {
                    return bad(format!(
                        "--pipeline-layer-split {split:?}: every stage needs a layer and the model has {num_layers} layers in all"
                    ));
                }
                split.clone()
            }
            None => {
                if p > num_layers {
                    return bad(format!(
                        "{p} pipeline stages for a model of {num_layers} layers: a stage needs at least one"
                    ));
                }
                (0..p)
                    .map(|s| num_layers / p + usize::from(s < num_layers % p))
                    .collect()
            }
        };
        let mut start = 0;
        Ok(counts
            .iter()
            .map(|&n| {
                start += n;
                start - n..start
            })
            .collect())
    }
}

/// One rank's part of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub tp_rank: usize,
    pub tp_size: usize,
    pub pp_rank: usize,
    pub pp_size: usize,
    /// The stage's layers (global indices).
    pub layers: Range<usize>,
    /// Logits only for the first this many tokens of the vocabulary (a draft model's
    /// proposals; see [`crate::LoadOptions::output_vocab`]); `None` for all.
    pub output_vocab: Option<usize>,
}

/// `[rank * n / parts, (rank + 1) * n / parts)`.
fn part(n: usize, rank: usize, parts: usize) -> Range<usize> {
    rank * n / parts..(rank + 1) * n / parts
}

impl Shard {
    /// The whole model in one process.
    pub fn whole(c: &ModelConfig) -> Shard {
        Shard {
            tp_rank: 0,
            tp_size: 1,
            pp_rank: 0,
            pp_size: 1,
            layers: 0..c.num_hidden_layers,
            output_vocab: None,
        }
    }

    /// The width of the logits of a vocabulary of `n`: `n`, or the output vocabulary when it
    /// is smaller.
    pub fn logits_vocab(&self, n: usize) -> usize {
        self.output_vocab.map_or(n, |v| v.min(n))
    }

    /// World rank `rank`'s shard of `c` under `layout`; an error naming the shape that does
    /// not divide.
    pub fn new(c: &ModelConfig, layout: &Layout, rank: usize) -> Result<Shard> {
        let stages = layout.stage_layers(c.num_hidden_layers)?;
        let t = layout.tensor_parallel;
        if rank >= layout.world_size() {
            return Err(ModelError::Invalid(format!(
                "rank {rank} is outside a layout of {} ranks",
                layout.world_size()
            )));
        }
        let bad = |m: String| Err(ModelError::Invalid(m));
        let (nh, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        if !nh.is_multiple_of(t) {
            return bad(format!(
                "the {nh} attention heads do not split over {t} tensor-parallel ranks"
            ));
        }
        if (t <= nkv && !nkv.is_multiple_of(t)) || (t > nkv && !t.is_multiple_of(nkv)) {
            return bad(format!(
                "the {nkv} KV heads do not split over {t} tensor-parallel ranks (nor does {t} divide by {nkv} to replicate them)"
            ));
        }
        let mut inter = vec![("intermediate size", c.intermediate_size)];
        if let Some(m) = &c.moe {
            inter.push(("expert intermediate size", m.expert_intermediate_size));
            if let Some(s) = m.shared_expert_intermediate_size {
                inter.push(("shared expert intermediate size", s));
            }
        }
        for (what, n) in inter {
            if !n.is_multiple_of(t) {
                return bad(format!(
                    "the {what} {n} does not split over {t} tensor-parallel ranks"
                ));
            }
        }
        if t > 1 && c.spec.qk_norm_full {
            return bad(
                "tensor parallel would split OLMoE's q/k norms, which span every head; run it with --tensor-parallel-size 1".into(),
            );
        }
        let pp_rank = rank / t;
        Ok(Shard {
            tp_rank: rank % t,
            tp_size: t,
            pp_rank,
            pp_size: layout.pipeline_parallel,
            layers: stages[pp_rank].clone(),
            output_vocab: None,
        })
    }

    /// This rank's query heads.
    pub fn q_heads(&self, num_heads: usize) -> Range<usize> {
        part(num_heads, self.tp_rank, self.tp_size)
    }

    /// This rank's KV heads (one, shared with other ranks, when they are fewer than ranks).
    pub fn kv_heads(&self, num_kv_heads: usize) -> Range<usize> {
        if self.tp_size > num_kv_heads {
            let h = self.tp_rank * num_kv_heads / self.tp_size;
            h..h + 1
        } else {
            part(num_kv_heads, self.tp_rank, self.tp_size)
        }
    }

    /// This rank's rows of the LM head (of a vocabulary of `n`): `ceil(n / T)` each, the last
    /// rank the rest.
    pub fn vocab(&self, n: usize) -> Range<usize> {
        let chunk = n.div_ceil(self.tp_size);
        let start = (self.tp_rank * chunk).min(n);
        start..(start + chunk).min(n)
    }

    /// This rank's rows of an MLP's intermediate of `n`.
    pub fn intermediate(&self, n: usize) -> Range<usize> {
        part(n, self.tp_rank, self.tp_size)
    }

    pub fn is_first_stage(&self) -> bool {
        self.pp_rank == 0
    }

    pub fn is_last_stage(&self) -> bool {
        self.pp_rank + 1 == self.pp_size
    }

    /// Whether this rank holds the whole logits (the last stage's first rank, which gathers
    /// the group's vocabulary slices).
    pub fn computes_logits(&self) -> bool {
        self.is_last_stage() && self.tp_rank == 0
    }

    /// The world rank of stage `stage`'s tensor-parallel rank `tp`.
    pub fn world_rank(&self, stage: usize, tp: usize) -> usize {
        stage * self.tp_size + tp
    }

    /// The config as this rank runs it: its heads, KV heads, intermediate size and layers
    /// (what its activation buffers and KV cache are sized from).
    pub fn local_config(&self, c: &ModelConfig) -> ModelConfig {
        let mut l = c.clone();
        l.num_attention_heads = self.q_heads(c.num_attention_heads).len();
        l.num_key_value_heads = self.kv_heads(c.num_key_value_heads).len();
        l.intermediate_size = c.intermediate_size / self.tp_size;
        l.num_hidden_layers = self.layers.len();
        l.layer_sliding_window = c.layer_sliding_window[self.layers.clone()].to_vec();
        if let Some(m) = l.moe.as_mut() {
            m.expert_intermediate_size /= self.tp_size;
            m.shared_expert_intermediate_size =
                m.shared_expert_intermediate_size.map(|s| s / self.tp_size);
            m.layer_is_moe = m.layer_is_moe[self.layers.clone()].to_vec();
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(tp: usize, pp: usize, split: Option<Vec<usize>>) -> Layout {
        Layout {
            tensor_parallel: tp,
            pipeline_parallel: pp,
            layer_split: split,
            micro_batches: 1,
        }
    }

    fn tiny_llama() -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        ModelConfig::from_hf_file(&dir.join("../../tests/fixtures/tiny-llama/config.json")).unwrap()
    }

    #[test]
    fn stages_split_evenly_or_as_asked() {
        assert_eq!(
            layout(1, 3, None).stage_layers(8).unwrap(),
            [0..3, 3..6, 6..8]
        );
        assert_eq!(
            layout(2, 2, Some(vec![10, 14])).stage_layers(24).unwrap(),
            [0..10, 10..24]
        );
        for (l, why) in [
            (layout(1, 2, Some(vec![10, 13])), "24 layers"),
            (layout(1, 2, Some(vec![24, 0])), "every stage needs a layer"),
            (layout(1, 3, Some(vec![12, 12])), "gives 2 stages"),
            (layout(1, 30, None), "at least one"),
            (layout(0, 1, None), "at least 1"),
        ] {
            let err = l.stage_layers(24).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let l = layout(2, 2, None);
        assert!(l.check_world_size(4).is_ok());
        let err = l.check_world_size(3).unwrap_err().to_string();
        assert!(
            err.contains("3 ranks were launched") && err.contains("mpirun -n 4"),
            "{err}"
        );
    }

    #[test]
    fn heads_split_and_kv_heads_replicate_past_their_count() {
        // tiny-llama: 4 heads, 2 KV heads, intermediate 128, 2 layers.
        let c = tiny_llama();
        let s = Shard::new(&c, &layout(4, 1, None), 3).unwrap();
        assert_eq!(
            (s.q_heads(4), s.kv_heads(2), s.intermediate(128)),
            (3..4, 1..2, 96..128)
        );
        let s = Shard::new(&c, &layout(4, 1, None), 1).unwrap();
        assert_eq!(s.kv_heads(2), 0..1);
        // A vocabulary of 10 over 4 ranks: 3, 3, 3 and 1 rows.
        let v: Vec<_> = (0..4)
            .map(|r| {
                Shard {
                    tp_rank: r,
                    ..s.clone()
                }
                .vocab(10)
            })
            .collect();
        assert_eq!(v, [0..3, 3..6, 6..9, 9..10]);
        let s = Shard::new(&c, &layout(2, 2, None), 3).unwrap();
        assert_eq!((s.tp_rank, s.pp_rank, s.layers.clone()), (1, 1, 1..2));
        assert!(s.is_last_stage() && !s.computes_logits());
        let local = s.local_config(&c);
        assert_eq!(
            (
                local.num_attention_heads,
                local.num_key_value_heads,
                local.intermediate_size,
                local.num_hidden_layers
            ),
            (2, 1, 64, 1)
        );
        let err = Shard::new(&c, &layout(3, 1, None), 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("4 attention heads do not split over 3"),
            "{err}"
        );
        let err = Shard::new(&c, &layout(2, 1, None), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside a layout of 2"), "{err}");
    }
}
