//! `ferrum inspect`: what a model is, without running it.

use anyhow::{Context, Result};
use clap::Args;
use ferrum_models::{ModelFormat, ModelInfo};
use ferrum_runtime::cpu::{GatedAct, RopeScaling};
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Model folder (config.json + safetensors) or .gguf file.
    #[arg(long)]
    model: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn inspect(args: &InspectArgs) -> Result<()> {
    let info = ferrum_models::inspect(&args.model)
        .with_context(|| format!("inspecting {}", args.model.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&info))?);
    } else {
        print!("{}", to_table(args, &info));
    }
    Ok(())
}

/// The devices this machine offers (`--device`): the CPU always, CUDA device 0 when usable.
fn devices() -> String {
    match ferrum_runtime::cuda::Gpu::cuda(0) {
        Ok(gpu) => format!("cpu, cuda:0 ({})", gpu.describe()),
        Err(e) => format!("cpu (no CUDA: {e})"),
    }
}

fn format_name(info: &ModelInfo) -> String {
    match (info.format, info.gguf_version) {
        (ModelFormat::Gguf, Some(v)) => format!("GGUF v{v}"),
        (ModelFormat::Gguf, None) => "GGUF".into(),
        (ModelFormat::HfFolder, _) => "Hugging Face folder (safetensors)".into(),
    }
}

fn rope_name(s: &RopeScaling) -> String {
    match s {
        RopeScaling::None => "none".into(),
        RopeScaling::Linear { factor } => format!("linear x{factor}"),
        RopeScaling::Llama3 { factor, .. } => format!("llama3 x{factor}"),
        RopeScaling::LongRope {
            original_max_position_embeddings,
            attention_factor,
            ..
        } => format!(
            "longrope (long factors past {original_max_position_embeddings} tokens, attention factor {attention_factor})"
        ),
    }
}

fn human(n: u64, unit: &str) -> String {
    let f = n as f64;
    match unit {
        "B" if f >= 1024.0 * 1024.0 * 1024.0 => format!("{:.2} GiB", f / (1u64 << 30) as f64),
        "B" if f >= 1024.0 * 1024.0 => format!("{:.2} MiB", f / (1u64 << 20) as f64),
        "B" if f >= 1024.0 => format!("{:.1} KiB", f / 1024.0),
        "B" => format!("{n} B"),
        _ if f >= 1e9 => format!("{:.2}B", f / 1e9),
        _ if f >= 1e6 => format!("{:.2}M", f / 1e6),
        _ if f >= 1e3 => format!("{:.1}K", f / 1e3),
        _ => n.to_string(),
    }
}

fn windows(info: &ModelInfo) -> String {
    let w = &info.config.layer_sliding_window;
    match (w.first().copied().flatten(), w.iter().all(|x| *x == w[0])) {
        (None, true) => "none".into(),
        (Some(n), true) => format!("{n} (all layers)"),
        _ => {
            let sizes: std::collections::BTreeSet<usize> = w.iter().flatten().copied().collect();
            let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
            let global: Vec<String> = w
                .iter()
                .enumerate()
                .filter(|(_, x)| x.is_none())
                .map(|(i, _)| i.to_string())
                .collect();
            format!(
                "{} on {} of {} layers (full attention: layers {})",
                sizes.join(", "),
                w.len() - global.len(),
                w.len(),
                global.join(", ")
            )
        }
    }
}

/// The family's particulars beyond the Llama shape, one line each (none for plain Llama).
fn particulars(c: &ferrum_models::ModelConfig) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if c.rotary_dim != c.head_dim {
        out.push((
            "partial rotary",
            format!("the first {} of {} head dims", c.rotary_dim, c.head_dim),
        ));
    }
    if c.spec.fused_projections {
        out.push((
            "fused weights",
            "qkv_proj and gate_up_proj, split at load".to_string(),
        ));
    }
    if let Some(m) = &c.moe {
        let moe_layers = m.layer_is_moe.iter().filter(|&&b| b).count();
        let mut experts = format!(
            "{} of {} per token ({}), expert size {}, on {moe_layers} of {} layers",
            m.top_k,
            m.num_experts,
            if m.norm_topk_prob {
                "weights renormalised"
            } else {
                "softmax weights"
            },
            m.expert_intermediate_size,
            m.layer_is_moe.len()
        );
        if let Some(s) = m.shared_expert_intermediate_size {
            experts.push_str(&format!(", plus a gated shared expert of size {s}"));
        }
        out.push(("experts", experts));
    }
    if c.spec.qk_norm_full {
        out.push(("qk norm over", "the whole q and k projections".to_string()));
    }
    if let Some(t) = c.rope_local_theta {
        out.push((
            "local rope",
            format!("theta {t} on sliding-window layers, unscaled"),
        ));
    }
    if let Some(s) = c.attention_scale {
        out.push((
            "attention scale",
            format!("{s} (query_pre_attn_scalar^-1/2)"),
        ));
    }
    if let Some(cap) = c.attn_logit_softcap {
        out.push(("attn softcap", format!("{cap} tanh(s / {cap})")));
    }
    if let Some(cap) = c.final_logit_softcap {
        out.push(("logit softcap", format!("{cap} tanh(l / {cap})")));
    }
    out
}

fn act_name(a: GatedAct) -> &'static str {
    match a {
        GatedAct::Silu => "silu",
        GatedAct::GeluTanh => "gelu_pytorch_tanh",
    }
}

fn to_table(args: &InspectArgs, info: &ModelInfo) -> String {
    let c = &info.config;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut s = String::new();
    let mut row = |k: &str, v: String| s.push_str(&format!("{k:<18}{v}\n"));
    row("model", args.model.display().to_string());
    row("devices", devices());
    row("format", format_name(info));
    row(
        "architecture",
        format!("{} (runs as {})", c.architecture, c.spec.name),
    );
    row("layers", c.num_hidden_layers.to_string());
    row("hidden size", c.hidden_size.to_string());
    row("intermediate size", c.intermediate_size.to_string());
    row(
        "attention",
        format!(
            "{} heads, {} KV heads, head dim {}",
            c.num_attention_heads, c.num_key_value_heads, c.head_dim
        ),
    );
    row("vocabulary", c.vocab_size.to_string());
    row("context length", c.max_position_embeddings.to_string());
    row(
        "rope",
        format!(
            "theta {}, scaling {}",
            c.rope_theta,
            rope_name(&c.rope_scaling)
        ),
    );
    row("rms norm eps", format!("{:e}", c.rms_norm_eps));
    row("sliding window", windows(info));
    row("tied embeddings", yes(c.tie_word_embeddings).into());
    row("qkv bias", yes(c.attention_bias).into());
    row("qk norm", yes(c.spec.qk_norm).into());
    row("mlp activation", act_name(c.hidden_act).into());
    for (k, v) in particulars(c) {
        row(k, v);
    }
    row(
        "parameters",
        format!("{} ({})", human(info.num_params, ""), info.num_params),
    );
    row(
        "weights",
        format!(
            "{} in {} tensors",
            human(info.num_bytes, "B"),
            info.num_tensors
        ),
    );
    for d in &info.dtypes {
        let bytes = d
            .num_bytes
            .map_or("unsupported type".into(), |b| human(b, "B"));
        row(
            &format!("  {}", d.dtype),
            format!(
                "{:>4} tensors {:>9} params {:>11}",
                d.num_tensors,
                human(d.num_params, ""),
                bytes
            ),
        );
    }
    row("tokenizer", yes(info.has_tokenizer).into());
    row("chat template", yes(info.has_chat_template).into());
    s
}

fn to_json(info: &ModelInfo) -> serde_json::Value {
    let c = &info.config;
    json!({
        "devices": devices(),
        "format": format_name(info),
        "architecture": c.architecture,
        "family": c.spec.name,
        "num_hidden_layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rope_scaling": rope_name(&c.rope_scaling),
        "rms_norm_eps": c.rms_norm_eps,
        "sliding_window": c.layer_sliding_window,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": act_name(c.hidden_act),
        "rotary_dim": c.rotary_dim,
        "num_experts": c.moe.as_ref().map(|m| m.num_experts),
        "num_experts_per_tok": c.moe.as_ref().map(|m| m.top_k),
        "norm_topk_prob": c.moe.as_ref().map(|m| m.norm_topk_prob),
        "moe_layers": c.moe.as_ref().map(|m| m.layer_is_moe.clone()),
        "rope_local_theta": c.rope_local_theta,
        "attention_scale": c.attention_scale,
        "attn_logit_softcapping": c.attn_logit_softcap,
        "final_logit_softcapping": c.final_logit_softcap,
        "num_params": info.num_params,
        "num_bytes": info.num_bytes,
        "num_tensors": info.num_tensors,
        "dtypes": info.dtypes.iter().map(|d| json!({
            "dtype": d.dtype,
            "num_tensors": d.num_tensors,
            "num_params": d.num_params,
            "num_bytes": d.num_bytes,
        })).collect::<Vec<_>>(),
        "has_tokenizer": info.has_tokenizer,
        "has_chat_template": info.has_chat_template,
    })
}
