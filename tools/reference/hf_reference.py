#!/usr/bin/python3
"""Independent float64 PyTorch reference, with Hugging Face semantics, for
`./remat dump --model DIR` files.

    hf_reference.py --model DIR DUMP [--loss-rtol 1e-5] [--aux-rtol 1e-5]
                    [--aux-atol 1e-7] [--grad-rtol 1e-4]

DIR is a Hugging Face model folder (config.json; model.safetensors or
model.safetensors.index.json and its shards; F32, BF16 or F16) of a
LlamaForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM or MixtralForCausalLM.
It is read here, not through remat. DUMP is a safetensors file holding every
parameter under its HF name (f32), batch.tokens [B, S+1] (integers), loss.ce,
loss.aux (0-dim or [1]) and grad.<name> for every parameter.

Checks, one line each:
  parameters  the dump's parameters are the folder's tensors, each equal to the
              folder's value converted to f32 bit for bit (the first mismatch
              is named); every grad.X is there with X's shape; no grad of
              anything else and no keys outside batch./loss./grad.
  loss.ce     |remat - torch| / |torch|
  loss.aux    relative difference (absolute when torch's aux is 0: dense)
  gradients   max |remat - torch| / max |torch| per parameter (a parameter
              torch gives no gradient, e.g. an expert no token chose: zeros;
              absolute when torch's gradient is all zero)
plus an `info` line with the smallest routing margin of the MoE layers.

The model (float64, the folder's values; inputs = tokens[:, :-1], targets =
tokens[:, 1:]; h = hidden_size, Dh = head_dim or h / num_attention_heads):
  x = embed_tokens[inputs]
  per layer i:
    x += o_proj(attention(rms_norm(x, input_layernorm)))
    x += mlp_i(rms_norm(x, post_attention_layernorm))
  logits = rms_norm(x, norm) @ lm_head.T   (embed_tokens.T when tied)
  ce = mean cross-entropy of logits against targets
  rms_norm(x, w) = x * rsqrt(mean(x^2) + rms_norm_eps) * w
  attention: q/k/v = x @ W.T (+ bias where the folder has one), split into
    heads of Dh; rotary "rotate half" on q and k at positions 0..S-1 with
    inv_freq = 1 / rope_theta^(arange(0, Dh, 2) / Dh); kv head j serves the
    num_heads / num_kv_heads consecutive q heads j*n .. j*n+n-1 (HF
    repeat_kv); causal softmax(q k^T / sqrt(Dh)) v; o_proj (+ bias for llama
    attention_bias).
  dense MLP: down(silu(gate(x)) * up(x)) (+ biases with llama mlp_bias).
  MoE layer (qwen2_moe sparse layers: i not in mlp_only_layers and
  (i+1) % decoder_sparse_step == 0; every mixtral layer):
    probs = softmax(x @ router.T) over the E experts; the top-k experts by
    probability; weights = their probabilities, divided by their sum iff
    norm_topk_prob (qwen2_moe, default false) or always (mixtral);
    out = sum_k weight_k * expert_k(x), experts SwiGLU (mixtral:
    w2(silu(w1 x) * w3 x)); qwen2_moe adds
    sigmoid(x @ shared_expert_gate.T) * shared_expert(x).
  aux (remat's definition, not HF's): per MoE layer E * sum_e f_e * P_e, f_e
    the fraction of the T*K (token, slot) pairs routed to e (a constant), P_e
    the mean over tokens of e's router probability; loss.aux is the sum over
    MoE layers. Gradients are those of ce + router_aux_loss_coef * aux (HF's
    default 0.001 when the config has no router_aux_loss_coef).

Exit status 0 when every check passes, 1 when one fails, 2 when the folder is
one the reference refuses (rope scaling, sliding windows, dropout, router
jitter, other activations, a folder that does not match its config): the
reason is printed. Uses Debian's python3-torch and numpy; no network.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (the loss and gradient checks, shared with remat's own reference)

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
             "BOOL": np.bool_}

ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe",
         "MixtralForCausalLM": "mixtral"}

# The HF config classes' defaults for keys a config.json may leave out (the
# sizes hidden_size, num_hidden_layers, num_attention_heads, vocab_size and
# intermediate_size are required here instead).
COMMON_DEFAULTS = {"num_key_value_heads": None, "head_dim": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                   "rope_theta": 10000.0, "rope_scaling": None, "attention_dropout": 0.0,
                   "tie_word_embeddings": False}
DEFAULTS = {
    "llama": {"attention_bias": False, "mlp_bias": False},
    "qwen2": {"num_key_value_heads": 32, "use_sliding_window": False},
    "qwen2_moe": {"num_key_value_heads": 16, "use_sliding_window": False, "num_experts": 60,
                  "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "norm_topk_prob": False, "decoder_sparse_step": 1,
                  "mlp_only_layers": None, "router_aux_loss_coef": 0.001},
    "mixtral": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "num_local_experts": 8,
                "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
                "sliding_window": None},
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")


class Refused(Exception):
    """The folder is one this reference does not reproduce (exit status 2)."""


# ---------------------------------------------------------------- reading

def read_safetensors(path):
    """{name: tensor} of a safetensors file; BF16 and F16 become float32 exactly."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = data[base + b : base + e]
        count = math.prod(info["shape"])
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in ST_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(ST_DTYPES[info["dtype"]]).newbyteorder("<"))
            if info["dtype"] == "F16":
                arr = arr.astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, not one this reader knows")
        if arr.size != count or base + e > len(data):
            raise ValueError(f"{path}: tensor {name}: {len(raw)} bytes for shape {info['shape']}")
        tensors[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("=")).reshape(info["shape"]))
    return tensors


def read_folder(folder):
    """(config dict, {name: float32 tensor}) of a HF model folder."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for file in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(folder, file))
            for name, t in part.items():
                if weight_map.get(name) != file:
                    raise Refused(f"{file} holds {name}, which the index puts in {weight_map.get(name)}")
                tensors[name] = t
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise Refused(f"the index names {missing[0]} (and {len(missing) - 1} more), no shard holds it")
    else:
        tensors = read_safetensors(os.path.join(folder, "model.safetensors"))
    return config, tensors


# ---------------------------------------------------------------- config

def model_config(raw):
    """The config with HF's defaults filled in; raises Refused naming why the
    reference cannot reproduce it."""
    archs = raw.get("architectures") or []
    kind = ARCHS.get(archs[0]) if len(archs) == 1 else None
    if kind is None:
        kind = raw.get("model_type") if raw.get("model_type") in DEFAULTS else None
    if kind is None:
        raise Refused(f"architectures {archs} / model_type {raw.get('model_type')!r}: the reference knows "
                      f"{sorted(ARCHS)}")
    c = dict(COMMON_DEFAULTS)
    c.update(DEFAULTS[kind])
    c.update(raw)
    c["kind"] = kind
    for k in REQUIRED:
        if not isinstance(c.get(k), int) or c[k] <= 0:
            raise Refused(f"config.json: {k} must be a positive integer (got {c.get(k)!r})")
    if "rope_parameters" in raw:  # transformers v5 spelling
        rp = raw["rope_parameters"] or {}
        if rp.get("rope_type", "default") != "default":
            raise Refused(f"rope_parameters {rp}: only default rotary embeddings are modelled")
        c["rope_theta"] = rp.get("rope_theta", c["rope_theta"])
    rs = c["rope_scaling"]
    if rs is not None and (rs.get("rope_type") or rs.get("type")) != "default":
        raise Refused(f"rope_scaling {json.dumps(rs)}: only unscaled rotary embeddings are modelled")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Refused(f"hidden_act {c['hidden_act']!r}: only silu is modelled")
    if float(c["attention_dropout"]) != 0.0:
        raise Refused(f"attention_dropout {c['attention_dropout']}: dropout is random, the reference has none")
    if kind in ("qwen2", "qwen2_moe") and c["use_sliding_window"]:
        raise Refused("use_sliding_window true: sliding-window attention is not modelled")
    if kind == "mixtral" and float(c["router_jitter_noise"]) != 0.0:
        raise Refused(f"router_jitter_noise {c['router_jitter_noise']}: random router noise is not reproducible")
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c["head_dim"] is None:
        if c["hidden_size"] % c["num_attention_heads"]:
            raise Refused(f"hidden_size {c['hidden_size']} is not a multiple of num_attention_heads "
                          f"{c['num_attention_heads']} and there is no head_dim")
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise Refused(f"num_key_value_heads {c['num_key_value_heads']} does not divide num_attention_heads "
                      f"{c['num_attention_heads']}")
    if c["head_dim"] % 2:
        raise Refused(f"head_dim {c['head_dim']} is odd (rotary pairs need an even head dim)")
    if kind == "qwen2_moe":
        c["mlp_only_layers"] = list(c["mlp_only_layers"] or [])
        c["experts"] = c["num_experts"]
    elif kind == "mixtral":
        c["experts"] = c["num_local_experts"]
    else:
        c["experts"] = 0
    if c["experts"] and not 0 < c["num_experts_per_tok"] <= c["experts"]:
        raise Refused(f"num_experts_per_tok {c['num_experts_per_tok']} with {c['experts']} experts")
    return c


def is_moe_layer(c, i):
    if c["kind"] == "mixtral":
        return True
    if c["kind"] == "qwen2_moe":
        return c["experts"] > 0 and i not in c["mlp_only_layers"] and (i + 1) % c["decoder_sparse_step"] == 0
    return False


def moe_names(c, i):
    """(router, [(gate, up, down) per expert], shared (gate, up, down) or None, shared gate or None)."""
    if c["kind"] == "mixtral":
        pre = f"model.layers.{i}.block_sparse_moe."
        experts = [tuple(f"{pre}experts.{e}.{w}" for w in ("w1", "w3", "w2")) for e in range(c["experts"])]
        return pre + "gate", experts, None, None
    pre = f"model.layers.{i}.mlp."
    experts = [tuple(f"{pre}experts.{e}.{w}_proj" for w in ("gate", "up", "down")) for e in range(c["experts"])]
    shared = tuple(f"{pre}shared_expert.{w}_proj" for w in ("gate", "up", "down"))
    return pre + "gate", experts, shared, pre + "shared_expert_gate"


def expected_parameters(c):
    """{name: shape} of every tensor the config's HF model has."""
    h, V, dh = c["hidden_size"], c["vocab_size"], c["head_dim"]
    qd, kvd = c["num_attention_heads"] * dh, c["num_key_value_heads"] * dh
    shapes = {"model.embed_tokens.weight": [V, h], "model.norm.weight": [h]}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [V, h]

    def linear(name, out, inp, bias=False):
        shapes[name + ".weight"] = [out, inp]
        if bias:
            shapes[name + ".bias"] = [out]

    def swiglu(names, ffn, bias=False):
        gate, up, down = names
        linear(gate, ffn, h, bias)
        linear(up, ffn, h, bias)
        linear(down, h, ffn, bias)

    qkv_bias = c["kind"] in ("qwen2", "qwen2_moe") or (c["kind"] == "llama" and c["attention_bias"])
    o_bias = c["kind"] == "llama" and c["attention_bias"]
    mlp_bias = c["kind"] == "llama" and c["mlp_bias"]
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        shapes[pre + "input_layernorm.weight"] = [h]
        shapes[pre + "post_attention_layernorm.weight"] = [h]
        linear(pre + "self_attn.q_proj", qd, h, qkv_bias)
        linear(pre + "self_attn.k_proj", kvd, h, qkv_bias)
        linear(pre + "self_attn.v_proj", kvd, h, qkv_bias)
        linear(pre + "self_attn.o_proj", h, qd, o_bias)
        if not is_moe_layer(c, i):
            swiglu(tuple(f"{pre}mlp.{w}_proj" for w in ("gate", "up", "down")), c["intermediate_size"], mlp_bias)
            continue
        router, experts, shared, shared_gate = moe_names(c, i)
        linear(router, c["experts"], h)
        ffn = c["intermediate_size"] if c["kind"] == "mixtral" else c["moe_intermediate_size"]
        for names in experts:
            swiglu(names, ffn)
        if shared:
            swiglu(shared, c["shared_expert_intermediate_size"])
            linear(shared_gate, 1, h)
    return shapes


# ---------------------------------------------------------------- the model

def linear(x, p, name):
    y = x @ p[name + ".weight"].T
    bias = p.get(name + ".bias")
    return y if bias is None else y + bias


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def rope_cos_sin(s, dh, theta):
    inv_freq = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    # [B, Hkv, S, D] -> [B, Hkv * n_rep, S, D], each kv head repeated n_rep times in place.
    b, hkv, s, d = x.shape
    return x[:, :, None].expand(b, hkv, n_rep, s, d).reshape(b, hkv * n_rep, s, d)


def attention(x, p, pre, c):
    b, s, _ = x.shape
    nh, nkv, dh = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = linear(x, p, pre + "q_proj").view(b, s, nh, dh).transpose(1, 2)
    k = linear(x, p, pre + "k_proj").view(b, s, nkv, dh).transpose(1, 2)
    v = linear(x, p, pre + "v_proj").view(b, s, nkv, dh).transpose(1, 2)
    cos, sin = rope_cos_sin(s, dh, float(c["rope_theta"]))
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    future = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    o = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
    return linear(o.transpose(1, 2).reshape(b, s, nh * dh), p, pre + "o_proj")


def swiglu(x, p, names):
    gate, up, down = names
    return linear(torch.nn.functional.silu(linear(x, p, gate)) * linear(x, p, up), p, down)


def moe(x, p, c, i):
    """Returns (output, aux, routing margin) of MoE layer i on x [B, S, h].

    The margin is the smallest gap over tokens between the k-th and (k+1)-th
    router probability (inf when k = E): when it is tiny, float32 rounding on
    the remat side may pick another expert.
    """
    b, s, h = x.shape
    router, experts, shared, shared_gate = moe_names(c, i)
    n_exp, top_k = c["experts"], c["num_experts_per_tok"]
    t = x.reshape(b * s, h)
    probs = torch.softmax(t @ p[router + ".weight"].T, -1)  # [T, E]
    weights, idx = torch.topk(probs, top_k, dim=-1, largest=True, sorted=True)
    if c["kind"] == "mixtral" or c["norm_topk_prob"]:
        weights = weights / weights.sum(-1, keepdim=True)
    y = torch.zeros_like(t)
    for e in range(n_exp):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel():  # an expert no token chose gets no gradient
            y = y.index_add(0, tok, swiglu(t[tok], p, experts[e]) * weights[tok, slot, None])
    if shared:
        y = y + torch.sigmoid(t @ p[shared_gate + ".weight"].T) * swiglu(t, p, shared)
    counts = torch.bincount(idx.reshape(-1), minlength=n_exp).to(t.dtype)
    aux = n_exp * ((counts / idx.numel()) * probs.mean(0)).sum()
    margin = math.inf
    if top_k < n_exp:
        with torch.no_grad():
            top = torch.topk(probs, top_k + 1, dim=-1).values
            margin = (top[:, top_k - 1] - top[:, top_k]).min().item()
    return y.reshape(b, s, h), aux, margin


def forward(p, tokens, c):
    """(ce, aux summed over MoE layers, {MoE layer: routing margin})."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    eps = float(c["rms_norm_eps"])
    x = p["model.embed_tokens.weight"][inputs]
    aux = torch.zeros((), dtype=torch.float64)
    margins = {}
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        x = x + attention(rms_norm(x, p[pre + "input_layernorm.weight"], eps), p, pre + "self_attn.", c)
        hn = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(c, i):
            y, layer_aux, margins[i] = moe(hn, p, c, i)
            aux = aux + layer_aux
        else:
            y = swiglu(hn, p, tuple(f"{pre}mlp.{w}_proj" for w in ("gate", "up", "down")))
        x = x + y
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if c["tie_word_embeddings"] else p["lm_head.weight"]
    logits = x @ head.T
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return ce, aux, margins


# ---------------------------------------------------------------- checks

def first_difference(a, b):
    """'' when a and b are the same float32 values bit for bit, else where they first differ."""
    if a.shape != b.shape:
        return f"shape {list(a.shape)} vs {list(b.shape)}"
    ia, ib = a.contiguous().view(torch.int32).reshape(-1), b.contiguous().view(torch.int32).reshape(-1)
    diff = (ia != ib).nonzero()
    if diff.numel() == 0:
        return ""
    j = diff[0].item()
    where = np.unravel_index(j, tuple(a.shape)) if a.dim() else ()
    return (f"at {list(map(int, where))}: dump {a.reshape(-1)[j].item()!r}, folder {b.reshape(-1)[j].item()!r} "
            f"({diff.numel()} of {a.numel()} values differ)")


def check_structure(dump, folder):
    """Lines describing what is wrong with the dump's key set and parameters ([] when nothing)."""
    bad = []
    params = [k for k in dump if not k.startswith(("grad.", "batch.", "loss."))]
    bad += [f"the dump lacks parameter {k}" for k in sorted(folder) if k not in dump]
    bad += [f"the dump has {k}, which the folder does not hold" for k in sorted(params) if k not in folder]
    for k in sorted(folder):
        if "grad." + k not in dump:
            bad.append(f"the dump lacks grad.{k}")
        elif list(dump["grad." + k].shape) != list(folder[k].shape):
            bad.append(f"grad.{k} is {list(dump['grad.' + k].shape)}, the parameter {list(folder[k].shape)}")
    bad += [f"the dump has {k}, a gradient of no parameter" for k in sorted(dump)
            if k.startswith("grad.") and k[5:] not in folder]
    for k in ("batch.tokens", "loss.ce", "loss.aux"):
        if k not in dump:
            bad.append(f"the dump lacks {k}")
    for k in ("loss.ce", "loss.aux"):
        if k in dump and dump[k].numel() != 1:
            bad.append(f"{k} has shape {list(dump[k].shape)}, expected [] or [1]")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the Hugging Face model folder the dump was made from")
    ap.add_argument("dump", help="a file written by ./remat dump --model DIR")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--aux-rtol", type=float, default=1e-5)
    ap.add_argument("--aux-atol", type=float, default=1e-7, help="used when the reference aux loss is 0")
    ap.add_argument("--grad-rtol", type=float, default=1e-4)
    args = ap.parse_args(argv)

    try:
        raw, folder = read_folder(args.model)
        c = model_config(raw)
        shapes = expected_parameters(c)
        wrong = [f"lacks {k} {v}" for k, v in shapes.items() if k not in folder]
        wrong += [f"has {k}, which the config's model does not" for k in sorted(folder) if k not in shapes]
        wrong += [f"has {k} {list(folder[k].shape)}, the config says {shapes[k]}"
                  for k in sorted(folder) if k in shapes and list(folder[k].shape) != shapes[k]]
        if wrong:
            raise Refused(f"the folder does not match its config.json: it {wrong[0]}"
                          + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""))
    except Refused as e:
        print(f"refused {args.model}: {e}")
        return 2
    dump = read_safetensors(args.dump)

    ok = True
    bad = check_structure(dump, folder)
    for line in bad:
        print(f"FAIL {line}")
    if bad:
        return 1
    mismatched = [(k, first_difference(dump[k].to(torch.float32), folder[k])) for k in sorted(folder)]
    mismatched = [(k, why) for k, why in mismatched if why]
    if mismatched:
        ok = False
        k, why = mismatched[0]
        print(f"FAIL parameters: {len(mismatched)} of {len(folder)} differ from the folder's; first {k} {why}")
    else:
        print(f"ok   parameters: the dump's {len(folder)} equal the folder's converted to f32, each with its grad")

    tokens = dump["batch.tokens"]
    if tokens.is_floating_point() or tokens.dim() != 2 or tokens.shape[1] < 2:
        print(f"FAIL batch.tokens is {tokens.dtype} {list(tokens.shape)}, expected integers [B, S+1]")
        return 1
    tokens = tokens.to(torch.int64)
    if tokens.min().item() < 0 or tokens.max().item() >= c["vocab_size"]:
        print(f"FAIL batch.tokens hold ids outside [0, {c['vocab_size']})")
        return 1

    # The reference runs on the folder's values (f32-exact), not the dump's.
    params = {k: t.to(torch.float64).requires_grad_(True) for k, t in folder.items()}
    ce_t, aux_t, margins = forward(params, tokens, c)
    coef = float(c.get("router_aux_loss_coef", 0.001)) if c["experts"] else 0.0
    (ce_t + coef * aux_t).backward()

    ok &= reference.check_losses(dump, ce_t, aux_t, args)

    if margins:
        layer = min(margins, key=margins.get)
        routing = (f"smallest top-{c['num_experts_per_tok']} routing margin {margins[layer]:.2e} (layer {layer})"
                   if math.isfinite(margins[layer]) else "every expert selected")
        print(f"info {len(margins)} MoE layers of {c['experts']} experts, aux coef {coef:g}; {routing}")

    ok &= reference.check_gradients(dump, params, sorted(folder), args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
