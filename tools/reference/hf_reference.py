#!/usr/bin/python3
"""Independent float64 PyTorch reference, with Hugging Face semantics, for
`./remat dump --model DIR` files.

    hf_reference.py --model DIR DUMP [--loss-rtol 1e-5] [--aux-rtol 1e-5]
                    [--aux-atol 1e-7] [--grad-rtol 1e-4]
                    [--lora r=R,alpha=A[,dropout=0][,targets=NAME,...]]
                    [--freeze GLOB[,GLOB...]] [--f32-floor]

DIR is a Hugging Face model folder (config.json; model.safetensors or
model.safetensors.index.json and its shards; F32, BF16 or F16) of a
LlamaForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM or MixtralForCausalLM.
It is read here, not through remat. DUMP is a safetensors file holding every
parameter under its HF name (f32), batch.tokens [B, S+1] (integers), loss.ce,
loss.aux (0-dim or [1]) and grad.<name> for every parameter that trains
(every parameter, unless --lora or --freeze says otherwise: see below).

Checks, one line each:
  parameters  the dump's parameters are the folder's tensors, each equal to the
              folder's value converted to f32 bit for bit (the first mismatch
              is named); every grad.X is there with X's shape; no grad of
              anything else and no keys outside batch./loss./grad. (With
              --lora / --freeze: a grad.X for every trainable X, none for a
              frozen one.)
  lora        (--lora only) the adapters, see below
  loss.ce     |remat - torch| / |torch|
  loss.aux    relative difference (absolute when torch's aux is 0: dense)
  gradients   max |remat - torch| / max |torch| per parameter (a parameter
              torch gives no gradient, e.g. an expert no token chose: zeros;
              absolute when torch's gradient is all zero)
plus an `info` line with the smallest routing margin of the MoE layers, and
with --f32-floor one with how far the same model run by PyTorch in float32
(the folder's values) is from float64 by the gradients' measure: the size of
float32 rounding alone, to read the gradients' figure against (about 1e-6 on
the tiny test models), and one with only the matmuls in float32 (the rest
float64): what float32 GEMMs alone cost.

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

LoRA (--lora), with the semantics of Hugging Face PEFT's LoraLayer for
nn.Linear (bias "none", no rsLoRA, no DoRA, one rank for every module):
  the dump holds, for each adapted Linear M of the model (M.weight [out, in]),
  M.lora_A.weight [r, in] and M.lora_B.weight [out, r]; M computes
    y = x @ W.T (+ b) + ((dropout(x) @ A.T) @ B.T) * (alpha / r)
  with dropout 0 (the reference refuses another: it is random). r is read
  from the adapters' shapes (all must agree, and agree with r= when given);
  alpha must be given. The Linears are those of the HF model: the attention
  and MLP projections, every expert's, the shared expert's, the routers
  (mlp.gate / block_sparse_moe.gate), shared_expert_gate and lm_head (tied:
  the embedding's values, its own adapter). With targets=, the adapted
  Linears are exactly those whose name's last part is a target (PEFT's
  target_modules list). The adapters train and nothing else does (PEFT's
  default); a dump with adapters needs --lora (exit 2 without it).
  Adapter values: those of the folder where it holds M.lora_A.weight /
  M.lora_B.weight (make_hf_model.py --lora-init writes them; the dump's must
  equal them bit for bit), else the dump's, which must be PEFT's fresh
  initialisation: B zero, A nonzero within Kaiming-uniform's +-1/sqrt(in).
Frozen parameters (--freeze GLOB,...: '*' any run of characters, '?' one, [A-B]
  a decimal number from A to B, matched against the whole HF name; each glob
  must match some parameter): the dump holds their values but no gradient.
Only the gradients of trainable parameters are compared; the model and the
loss are the same whatever trains.

Exit status 0 when every check passes, 1 when one fails, 2 when the folder is
one the reference refuses (rope scaling, sliding windows, dropout, router
jitter, other activations, a folder that does not match its config, LoRA
adapters without --lora or with dropout, a --freeze glob matching nothing):
the reason is printed. Uses Debian's python3-torch and numpy; no network.
"""

import argparse
import json
import math
import os
import re
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
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
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


def parse_lora(spec):
    """{r (None: from the shapes), alpha, targets (None: any)} of a --lora
    spec 'r=R,alpha=A,dropout=P,targets=N1,N2' (targets last: its names run to
    the end); raises Refused for dropout != 0 or no alpha, ValueError for a
    malformed spec."""
    out = {"r": None, "alpha": None, "targets": None}
    dropout = 0.0
    parts = spec.split(",")
    for j, part in enumerate(parts):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--lora {spec!r}: {part!r} is not KEY=VALUE (keys r, alpha, dropout, targets)")
        if key == "targets":
            out["targets"] = [value] + parts[j + 1 :]
            if not all(out["targets"]) or any("=" in t or "." in t for t in out["targets"]):
                raise ValueError(f"--lora {spec!r}: targets= takes module names (the last part of a Linear's "
                                 "name) and must come last")
            break
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--lora {spec!r}: {key}={value!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"--lora {spec!r}: {key}={value!r} is not a finite number")
        if key == "r":
            if number != int(number) or number < 1:
                raise ValueError(f"--lora {spec!r}: r must be an integer >= 1")
            out["r"] = int(number)
        elif key == "alpha":
            if not number > 0:
                raise ValueError(f"--lora {spec!r}: alpha must be > 0")
            out["alpha"] = number
        elif key == "dropout":
            dropout = number
        else:
            raise ValueError(f"--lora {spec!r}: unknown key {key!r} (keys r, alpha, dropout, targets)")
    if dropout != 0.0:
        raise Refused(f"--lora dropout={dropout:g}: dropout is random, the reference checks dropout 0 only")
    if out["alpha"] is None:
        raise Refused(f"--lora {spec!r}: give alpha= (the scaling is alpha / r)")
    return out


def glob_regex(pattern):
    """A compiled regex for a --freeze glob: '*' any run, '?' one character,
    [A-B] a decimal number from A to B; the whole name must match."""
    out, j = "", 0
    while j < len(pattern):
        ch = pattern[j]
        if ch == "*":
            out += ".*"
        elif ch == "?":
            out += "."
        elif ch == "[":
            end = pattern.find("]", j)
            lo, sep, hi = pattern[j + 1 : end].partition("-") if end > 0 else ("", "", "")
            if not (sep and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
                raise Refused(f"--freeze {pattern!r}: a bracket must be a number range [A-B] with A <= B")
            out += "(?:" + "|".join(str(n) for n in range(int(hi), int(lo) - 1, -1)) + ")"
            j = end
        else:
            out += re.escape(ch)
        j += 1
    return re.compile(out + r"\Z")


def is_adapter(name):
    return name.endswith(LORA_SUFFIXES)


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
    return model_layout(c)[0]


def linear_modules(c):
    """{module name: [out, in]} of every nn.Linear of the config's HF model
    (lm_head too when tied: a Linear whose weight is the embedding's)."""
    return model_layout(c)[1]


def model_layout(c):
    """({parameter name: shape}, {Linear module name: [out, in]})."""
    h, V, dh = c["hidden_size"], c["vocab_size"], c["head_dim"]
    qd, kvd = c["num_attention_heads"] * dh, c["num_key_value_heads"] * dh
    shapes = {"model.embed_tokens.weight": [V, h], "model.norm.weight": [h]}
    linears = {"lm_head": [V, h]}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [V, h]

    def linear(name, out, inp, bias=False):
        linears[name] = [out, inp]
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
    return shapes, linears


# ---------------------------------------------------------------- the model

def linear(x, p, name, c):
    y = x @ p[name + ".weight"].T
    bias = p.get(name + ".bias")
    if bias is not None:
        y = y + bias
    return lora(y, x, p, name, c)


def lora(y, x, p, name, c):
    """y plus the module's LoRA term, PEFT's order: y + lora_B(lora_A(x)) * scaling."""
    a = p.get(name + ".lora_A.weight")
    if a is None:
        return y
    return y + ((x @ a.T) @ p[name + ".lora_B.weight"].T) * c["lora_scaling"]


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
    q = linear(x, p, pre + "q_proj", c).view(b, s, nh, dh).transpose(1, 2)
    k = linear(x, p, pre + "k_proj", c).view(b, s, nkv, dh).transpose(1, 2)
    v = linear(x, p, pre + "v_proj", c).view(b, s, nkv, dh).transpose(1, 2)
    cos, sin = (t.to(x.dtype) for t in rope_cos_sin(s, dh, float(c["rope_theta"])))
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    future = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    o = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
    return linear(o.transpose(1, 2).reshape(b, s, nh * dh), p, pre + "o_proj", c)


def swiglu(x, p, names, c):
    gate, up, down = names
    return linear(torch.nn.functional.silu(linear(x, p, gate, c)) * linear(x, p, up, c), p, down, c)


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
    probs = torch.softmax(linear(t, p, router, c), -1)  # [T, E]
    weights, idx = torch.topk(probs, top_k, dim=-1, largest=True, sorted=True)
    if c["kind"] == "mixtral" or c["norm_topk_prob"]:
        weights = weights / weights.sum(-1, keepdim=True)
    y = torch.zeros_like(t)
    for e in range(n_exp):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel():  # an expert no token chose gets no gradient
            y = y.index_add(0, tok, swiglu(t[tok], p, experts[e], c) * weights[tok, slot, None])
    if shared:
        y = y + torch.sigmoid(linear(t, p, shared_gate, c)) * swiglu(t, p, shared, c)
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
    aux = torch.zeros((), dtype=x.dtype)
    margins = {}
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        x = x + attention(rms_norm(x, p[pre + "input_layernorm.weight"], eps), p, pre + "self_attn.", c)
        hn = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(c, i):
            y, layer_aux, margins[i] = moe(hn, p, c, i)
            aux = aux + layer_aux
        else:
            y = swiglu(hn, p, tuple(f"{pre}mlp.{w}_proj" for w in ("gate", "up", "down")), c)
        x = x + y
    x = rms_norm(x, p["model.norm.weight"], eps)
    if c["tie_word_embeddings"]:  # HF's lm_head Linear holds the embedding's weight
        logits = lora(x @ p["model.embed_tokens.weight"].T, x, p, "lm_head", c)
    else:
        logits = linear(x, p, "lm_head", c)
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


def check_structure(dump, shapes, trainable):
    """Lines describing what is wrong with the dump's key set and parameters ([] when nothing).

    shapes: {name: shape} of the model's parameters (the folder's tensors and
    the LoRA adapters); trainable: the names that must have a grad.X (the
    others must not)."""
    bad = []
    params = [k for k in dump if not k.startswith(("grad.", "batch.", "loss."))]
    bad += [f"the dump lacks parameter {k}" for k in sorted(shapes) if k not in dump]
    bad += [f"the dump has {k}, which the folder does not hold" for k in sorted(params) if k not in shapes]
    for k in sorted(shapes):
        if k not in trainable:
            if "grad." + k in dump:
                bad.append(f"the dump has grad.{k}, but {k} is frozen")
        elif "grad." + k not in dump:
            bad.append(f"the dump lacks grad.{k}")
        elif list(dump["grad." + k].shape) != list(shapes[k]):
            bad.append(f"grad.{k} is {list(dump['grad.' + k].shape)}, the parameter {list(shapes[k])}")
    bad += [f"the dump has {k}, a gradient of no parameter" for k in sorted(dump)
            if k.startswith("grad.") and k[5:] not in shapes]
    for k in ("batch.tokens", "loss.ce", "loss.aux"):
        if k not in dump:
            bad.append(f"the dump lacks {k}")
    for k in ("loss.ce", "loss.aux"):
        if k in dump and dump[k].numel() != 1:
            bad.append(f"{k} has shape {list(dump[k].shape)}, expected [] or [1]")
    return bad


def check_adapters(c, lora, adapters):
    """(lines describing what is wrong, r) of the adapters {name: tensor}
    (the folder's and the dump's) against the model's Linears and --lora."""
    linears = linear_modules(c)
    bad, ranks = [], set()
    modules = sorted({k[: -len(suffix)] for k in adapters for suffix in LORA_SUFFIXES if k.endswith(suffix)})
    for m in modules:
        a, b = adapters.get(m + ".lora_A.weight"), adapters.get(m + ".lora_B.weight")
        if m not in linears:
            bad.append(f"{m} has an adapter but is not a Linear of the model")
            continue
        if a is None or b is None:
            bad.append(f"{m} has lora_{'B' if a is None else 'A'} without lora_{'A' if a is None else 'B'}")
            continue
        out, inp = linears[m]
        r = a.shape[0] if a.dim() == 2 else -1
        if list(a.shape) != [r, inp] or list(b.shape) != [out, r] or r < 1:
            bad.append(f"{m}: lora_A {list(a.shape)} and lora_B {list(b.shape)}, expected [r, {inp}] and [{out}, r]")
            continue
        ranks.add(r)
    if len(ranks) > 1:
        bad.append(f"the adapters have ranks {sorted(ranks)}: one r for every module")
    r = min(ranks) if ranks else None
    if lora["r"] is not None and r is not None and r != lora["r"]:
        bad.append(f"the adapters have rank {r}, --lora says r={lora['r']}")
    if lora["targets"] is not None:
        want = {m for m in linears if m.rsplit(".", 1)[-1] in lora["targets"]}
        unmatched = [t for t in lora["targets"] if not any(m.rsplit(".", 1)[-1] == t for m in linears)]
        bad += [f"target {t} names no Linear of the model" for t in unmatched]
        lacking = sorted(want - set(modules))
        extra = sorted(set(modules) - want)
        if lacking:
            bad.append(f"{len(lacking)} targeted Linears have no adapter, e.g. {lacking[0]}")
        if extra:
            bad.append(f"{len(extra)} Linears not targeted have one, e.g. {extra[0]}")
    return bad, r


def check_fresh_adapters(fresh):
    """Lines describing how the dump's own adapters {name: tensor} differ from
    PEFT's initialisation: B zero, A nonzero within +-1/sqrt(in)."""
    bad = []
    for k in sorted(fresh):
        t = fresh[k].to(torch.float64)
        if k.endswith(".lora_B.weight") and t.abs().max().item() != 0:
            bad.append(f"{k} is not zero (a fresh lora_B is)")
        if k.endswith(".lora_A.weight"):
            bound = 1.0 / math.sqrt(t.shape[1])
            top = t.abs().max().item()
            if not 0 < top <= bound * (1 + 2.0 ** -23):
                bad.append(f"{k}: max |value| {top:.6g}, a fresh lora_A is nonzero within +-1/sqrt(in) = {bound:.6g}")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the Hugging Face model folder the dump was made from")
    ap.add_argument("dump", help="a file written by ./remat dump --model DIR")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--aux-rtol", type=float, default=1e-5)
    ap.add_argument("--aux-atol", type=float, default=1e-7, help="used when the reference aux loss is 0")
    ap.add_argument("--grad-rtol", type=float, default=1e-4)
    ap.add_argument("--lora", metavar="r=R,alpha=A[,dropout=0][,targets=NAME,...]",
                    help="the dump's LoRA adapters: alpha (required), r and targets (checked when given)")
    ap.add_argument("--freeze", metavar="GLOB[,GLOB...]", help="parameters without a gradient")
    ap.add_argument("--f32-floor", action="store_true",
                    help="also print (info) how far the same model run by PyTorch in float32 is from float64, "
                    "and the same with only its matmuls in float32")
    args = ap.parse_args(argv)

    try:
        lora = parse_lora(args.lora) if args.lora else None
    except (ValueError, Refused) as e:
        print(f"refused: {e}")
        return 2
    try:
        raw, folder = read_folder(args.model)
        c = model_config(raw)
        shapes = expected_parameters(c)
        base = {k: t for k, t in folder.items() if not is_adapter(k)}
        wrong = [f"lacks {k} {v}" for k, v in shapes.items() if k not in base]
        wrong += [f"has {k}, which the config's model does not" for k in sorted(base) if k not in shapes]
        wrong += [f"has {k} {list(base[k].shape)}, the config says {shapes[k]}"
                  for k in sorted(base) if k in shapes and list(base[k].shape) != shapes[k]]
        if wrong:
            raise Refused(f"the folder does not match its config.json: it {wrong[0]}"
                          + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""))
        held = sorted(k for k in folder if is_adapter(k))
        if held and lora is None:
            raise Refused(f"the folder holds LoRA adapters ({held[0]}, ...): give --lora alpha=A")
    except Refused as e:
        print(f"refused {args.model}: {e}")
        return 2
    dump = read_safetensors(args.dump)
    dumped = sorted(k for k in dump if is_adapter(k) and not k.startswith(("grad.", "batch.", "loss.")))
    if dumped and lora is None:
        print(f"refused {args.dump}: it holds LoRA adapters ({dumped[0]}, ...): give --lora alpha=A")
        return 2

    # The model's parameters: the folder's tensors and the adapters (the
    # folder's initial values where it holds them, else the dump's).
    values = dict(folder)
    fresh = {k: dump[k] for k in dumped if k not in folder}
    values.update(fresh)
    names = sorted(values)
    trainable = set(names)
    if lora is not None:
        trainable = {k for k in names if is_adapter(k)}
    try:
        for pattern in (args.freeze.split(",") if args.freeze else []):
            if not pattern:
                raise Refused(f"--freeze {args.freeze!r}: an empty glob")
            matched = {k for k in names if glob_regex(pattern).match(k)}
            if not matched:
                raise Refused(f"--freeze glob {pattern!r} matches no parameter")
            trainable -= matched
    except Refused as e:
        print(f"refused: {e}")
        return 2

    ok = True
    bad = check_structure(dump, {k: list(t.shape) for k, t in values.items()}, trainable)
    r = None
    if lora is not None:
        more, r = check_adapters(c, lora, values)
        bad += more
        if not any(is_adapter(k) for k in names):
            bad.append("--lora is given, the dump holds no adapters")
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
    elif lora is None and args.freeze is None:
        print(f"ok   parameters: the dump's {len(folder)} equal the folder's converted to f32, each with its grad")
    else:
        print(f"ok   parameters: the dump's {len(folder)} from the folder equal its values converted to f32; "
              f"{len(trainable)} trainable, each with its grad; {len(names) - len(trainable)} frozen, none with one")
    if lora is not None:
        c["lora_scaling"] = lora["alpha"] / r
        modules = sorted({k.rsplit(".", 2)[0] for k in names if is_adapter(k)})
        leaves = sorted({m.rsplit(".", 1)[-1] for m in modules})
        init = check_fresh_adapters(fresh)
        for line in init:
            print(f"FAIL lora: {line}")
        ok &= not init
        where = (f"{len(modules) - len(fresh) // 2} with the folder's initial values"
                 + (f", {len(fresh) // 2} fresh (B zero, A within +-1/sqrt(in))" if fresh else ""))
        print(f"{'FAIL' if init else 'ok  '} lora: {len(modules)} adapted Linears ({','.join(leaves)}), r={r}, "
              f"alpha={lora['alpha']:g} (scaling {c['lora_scaling']:g}), dropout 0; {where}")

    tokens = dump["batch.tokens"]
    if tokens.is_floating_point() or tokens.dim() != 2 or tokens.shape[1] < 2:
        print(f"FAIL batch.tokens is {tokens.dtype} {list(tokens.shape)}, expected integers [B, S+1]")
        return 1
    tokens = tokens.to(torch.int64)
    if tokens.min().item() < 0 or tokens.max().item() >= c["vocab_size"]:
        print(f"FAIL batch.tokens hold ids outside [0, {c['vocab_size']})")
        return 1

    # The reference runs on the folder's values (f32-exact), not the dump's
    # (the dump's own for fresh adapters, the only source of remat's draws).
    params = {k: t.to(torch.float64).requires_grad_(k in trainable) for k, t in values.items()}
    ce_t, aux_t, margins = forward(params, tokens, c)
    coef = float(c.get("router_aux_loss_coef", 0.001)) if c["experts"] else 0.0
    total = ce_t + coef * aux_t
    if total.requires_grad:
        total.backward()

    ok &= reference.check_losses(dump, ce_t, aux_t, args)

    if margins:
        layer = min(margins, key=margins.get)
        routing = (f"smallest top-{c['num_experts_per_tok']} routing margin {margins[layer]:.2e} (layer {layer})"
                   if math.isfinite(margins[layer]) else "every expert selected")
        print(f"info {len(margins)} MoE layers of {c['experts']} experts, aux coef {coef:g}; {routing}")

    ok &= reference.check_gradients(dump, params, sorted(trainable), args)
    if args.f32_floor and trainable:
        print(f32_floor(values, tokens, c, coef, params, sorted(trainable), ce_t.item()))
    return 0 if ok else 1


class _Float32Matmuls(torch.overrides.TorchFunctionMode):
    """Every float64 matmul (`@`, torch.matmul; their backward too) computed
    in float32 and widened again: the rest of the model stays float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("matmul", "__matmul__") and args[0].dtype == torch.float64:
            return func(args[0].to(torch.float32), args[1].to(torch.float32), **kwargs).to(torch.float64)
        return func(*args, **kwargs)


def _worst_against(params, p, names):
    """(the worst max |g - g64| / max |g64| over `names`, its name)."""
    worst = (0.0, names[0])
    for k in names:
        g64 = params[k].grad if params[k].grad is not None else torch.zeros_like(params[k])
        g = p[k].grad.to(torch.float64) if p[k].grad is not None else torch.zeros_like(g64)
        scale = g64.abs().max().item()
        worst = max(worst, ((g - g64).abs().max().item() / (scale if scale > 0 else 1.0), k))
    return worst


def f32_floor(values, tokens, c, coef, params, names, ce64):
    """Two info lines: the same model and loss in float32 (PyTorch's kernels),
    its gradients against the float64 ones by the gradient check's measure --
    how close float32 arithmetic itself comes -- and the same with only the
    matmuls in float32 (what float32 GEMMs alone cost)."""
    p32 = {k: t.to(torch.float32).clone().requires_grad_(k in names) for k, t in values.items()}
    ce, aux, _ = forward(p32, tokens, c)
    (ce + coef * aux).backward()
    worst = _worst_against(params, p32, names)
    pmm = {k: t.to(torch.float64).clone().requires_grad_(k in names) for k, t in values.items()}
    with _Float32Matmuls():
        ce_mm, aux_mm, _ = forward(pmm, tokens, c)
        (ce_mm + coef * aux_mm).backward()
    worst_mm = _worst_against(params, pmm, names)
    return (f"info torch float32 of the same model: worst grad.{worst[1]}: {worst[0]:.2e} from float64 "
            f"(loss.ce rel diff {abs(ce.item() - ce64) / abs(ce64):.2e})\n"
            f"info torch float64 with float32 matmuls only: worst grad.{worst_mm[1]}: {worst_mm[0]:.2e}")

if __name__ == "__main__":
    sys.exit(main())
