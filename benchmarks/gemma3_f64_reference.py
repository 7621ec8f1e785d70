"""An independent float64 reference of Gemma 3 270M's first generated position: the model's
definition (Hugging Face's Gemma3ForCausalLM: sqrt(hidden)-scaled embedding, (1 + w) RMSNorms
before and after attention and the MLP, per-head q/k norm, rotate-half RoPE with base 1e4 on
local and 1e6 on every 6th (global) layer, window 512, GELU(tanh)-gated MLP, tied head) written
in numpy over the GGUF's weights as gguf-py dequantizes them (the file stores norms as 1 + w).
No quantized activations, no f16 cache: what an exact engine computes from this file. Writes
the top-5 log-probabilities of every prompt of the llama.cpp reference file:

    python benchmarks/gemma3_f64_reference.py models/gemma-3-270m-q4_k_m.gguf \
        tests/fixtures/gemma3-270m/llamacpp.json > tests/fixtures/gemma3-270m/f64_top5.json

Needs `pip install gguf numpy` (gguf 0.19.0, numpy 2.4.6 here).
"""
import json, sys, numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
r = GGUFReader(sys.argv[1])
T = {t.name: t for t in r.tensors}
def W(name):
    t = T[name]
    w = dequantize(t.data, t.tensor_type).astype(np.float64)
    # ggml shapes are [in, out]: a matrix comes back as [out, in].
    return w.reshape(int(t.shape[1]), -1) if len(t.shape) > 1 else w.reshape(-1)
E = W('token_embd.weight')
H, NH, NKV, HD, L = 640, 4, 1, 256, 18
eps = 1e-6
def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
def rope(x, pos, theta):
    half = HD // 2
    inv = 1.0 / theta ** (np.arange(0, HD, 2) / HD)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    c, s = c[:, None, :], s[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
def gelu(x): return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
layers = []
for l in range(L):
    g = lambda n: W(f'blk.{l}.{n}.weight')
    layers.append({n: g(n) for n in ['attn_norm','attn_q','attn_k','attn_v','attn_output','attn_q_norm','attn_k_norm','post_attention_norm','ffn_norm','ffn_gate','ffn_up','ffn_down','post_ffw_norm']})
onorm = W('output_norm.weight')
ref = json.load(open(sys.argv[2]))
out = []
for case in ref['cases']:
    ids = case['prompt_ids']; n = len(ids); pos = np.arange(n, dtype=np.float64)
    x = E[ids] * np.float64(np.float32(np.sqrt(H)))
    for l, p in enumerate(layers):
        sliding = (l + 1) % 6 != 0
        theta = 10000.0 if sliding else 1e6
        h = rms(x, p['attn_norm'])
        q = (h @ p['attn_q'].T).reshape(n, NH, HD); k = (h @ p['attn_k'].T).reshape(n, NKV, HD); v = (h @ p['attn_v'].T).reshape(n, NKV, HD)
        q = rms(q, p['attn_q_norm']); k = rms(k, p['attn_k_norm'])
        q = rope(q, pos, theta); k = rope(k, pos, theta)
        att = np.zeros((n, NH, HD))
        for hh in range(NH):
            s = q[:, hh, :] @ k[:, 0, :].T / 16.0
            mask = np.tril(np.ones((n, n), bool))
            if sliding: mask &= (np.arange(n)[:, None] - np.arange(n)[None, :]) < 512
            s = np.where(mask, s, -np.inf); s -= s.max(-1, keepdims=True); e = np.exp(s); e /= e.sum(-1, keepdims=True)
            att[:, hh, :] = e @ v[:, 0, :]
        o = att.reshape(n, NH * HD) @ p['attn_output'].T
        x = x + rms(o, p['post_attention_norm'])
        h = rms(x, p['ffn_norm'])
        m = (gelu(h @ p['ffn_gate'].T) * (h @ p['ffn_up'].T)) @ p['ffn_down'].T
        x = x + rms(m, p['post_ffw_norm'])
    lg = rms(x[-1], onorm) @ E.T
    lp = lg - lg.max(); lp = lp - np.log(np.exp(lp).sum())
    top = np.argsort(lp)[::-1][:5]
    out.append({'name': case['name'], 'top5': [[int(t), float(lp[t])] for t in top], 'llamacpp_top5': [[t, float(lp[t])] for t, _ in case['first_top5_logprobs']]})
print(json.dumps({'about': 'benchmarks/gemma3_f64_reference.py: float64 numpy forward of the GGUF weights dequantized by gguf-py; top5 are its five most likely first tokens, llamacpp_top5 its log-probabilities of llama.cpp\'s five', 'cases': out}, indent=1))
