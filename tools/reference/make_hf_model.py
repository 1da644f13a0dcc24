#!/usr/bin/python3
"""Writes a small random Hugging Face model folder for tests, laid out as
`save_pretrained` does (no `transformers` needed):

  DIR/config.json                     the keys the HF config class of the
                                      architecture writes (see build_config)
  DIR/model.safetensors               one file, or with --shards N > 1:
  DIR/model-0000K-of-0000N.safetensors   the tensors in name order, cut into N
  DIR/model.safetensors.index.json       runs of about equal bytes, and
                                      {"metadata": {"total_size": BYTES},
                                       "weight_map": {name: file}}
  DIR/tokenizer.json, tokenizer_config.json   with --tokenizer-from PATH

Architectures and their parameters (HF names, projections [out, in];
h = hidden, H/Hkv = heads / kv heads, Dh = head_dim or h / H):

  model.embed_tokens.weight                          [V, h]
  model.layers.{i}.input_layernorm.weight            [h]
  model.layers.{i}.self_attn.q_proj.weight           [H*Dh, h]
  model.layers.{i}.self_attn.{k,v}_proj.weight       [Hkv*Dh, h]
  model.layers.{i}.self_attn.o_proj.weight           [h, H*Dh]
      + q/k/v_proj.bias (qwen2, qwen2_moe), q/k/v/o_proj.bias (llama with
        attention_bias)
  model.layers.{i}.post_attention_layernorm.weight   [h]
  dense MLP (llama, qwen2, qwen2_moe's dense layers; ffn = intermediate):
  model.layers.{i}.mlp.{gate,up}_proj.weight         [ffn, h]
  model.layers.{i}.mlp.down_proj.weight              [h, ffn]
      (+ .bias on each with llama's mlp_bias)
  qwen2_moe sparse layer (i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0):
  model.layers.{i}.mlp.gate.weight                   [E, h]
  model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight   (moe_intermediate_size)
  model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight (shared_expert_intermediate_size)
  model.layers.{i}.mlp.shared_expert_gate.weight     [1, h]
  mixtral (every layer; ffn = intermediate_size):
  model.layers.{i}.block_sparse_moe.gate.weight      [E, h]
  model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight / w3.weight  [ffn, h], w2.weight [h, ffn]
  model.norm.weight                                  [h]
  lm_head.weight                                     [V, h]   (absent when tied)

Values come from torch's generator seeded with --seed, drawn in the order
above, in float32, then rounded to --dtype: projections normal(0, 0.02);
q/k projections and routers normal(0, 0.08) (so attention and routing are not
uniform); norm weights 1 + normal(0, 0.1); biases normal(0, 0.05).

The safetensors files are written here by hand: 8-byte little-endian header
length, a compact JSON header ({"__metadata__": {"format": "pt"}, name:
{"dtype", "shape", "data_offsets"}}) padded with spaces to a multiple of 8,
then the tensors' little-endian bytes in header order.

--lora-init r=R,targets=NAME,... adds initial LoRA adapter values for every
Linear whose last name part is a target (q_proj, k_proj, v_proj, o_proj,
gate_proj, up_proj, down_proj, Mixtral's w1/w2/w3, the routers' gate,
shared_expert_gate, lm_head): <linear>.lora_A.weight [R, in] uniform in
+-1/sqrt(in) (PEFT's Kaiming-uniform range) and <linear>.lora_B.weight
[out, R] normal(0, 0.05) -- nonzero, unlike PEFT's fresh B, so that A's
gradient is not zero. They are drawn after every base tensor (the base
weights are the same with or without them), stored in f32 whatever --dtype,
in the same files as the base weights (`./remat dump --model DIR --lora ...`
reads an adapter the folder holds instead of drawing a fresh one).

--extra KEY=JSON changes config.json only (the weights follow the other
flags), for tests of configs or mismatches a loader must refuse, e.g.
--extra 'rope_scaling={"type":"linear","factor":2.0}'.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import torch

ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "mixtral": ("MixtralForCausalLM", "mixtral"),
}
DTYPES = {  # flag -> (torch dtype, safetensors dtype, config torch_dtype)
    "f32": (torch.float32, "F32", "float32"),
    "bf16": (torch.bfloat16, "BF16", "bfloat16"),
    "f16": (torch.float16, "F16", "float16"),
}
TRANSFORMERS_VERSION = "4.46.0"
MAX_POSITIONS = 2048


def build_config(a):
    """config.json of the architecture, keys as the HF config class writes them."""
    arch, model_type = ARCHS[a.arch]
    c = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
    }
    if a.head_dim is not None:
        c["head_dim"] = a.head_dim
    c.update({
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "initializer_range": 0.02,
        "rms_norm_eps": a.eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": None,
        "attention_dropout": 0.0,
        "tie_word_embeddings": a.tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "torch_dtype": DTYPES[a.dtype][2],
        "transformers_version": TRANSFORMERS_VERSION,
    })
    if a.arch == "llama":
        c.update({"attention_bias": bool(a.attention_bias), "mlp_bias": bool(a.mlp_bias), "pretraining_tp": 1})
    if a.arch in ("qwen2", "qwen2_moe"):
        c.update({"use_sliding_window": False, "sliding_window": MAX_POSITIONS, "max_window_layers": a.layers})
    if a.arch == "qwen2_moe":
        c.update({
            "num_experts": a.experts,
            "num_experts_per_tok": a.top_k,
            "moe_intermediate_size": a.moe_intermediate,
            "shared_expert_intermediate_size": a.shared_intermediate,
            "norm_topk_prob": bool(a.norm_topk),
            "decoder_sparse_step": a.sparse_step,
            "mlp_only_layers": a.mlp_only_layers,
            "router_aux_loss_coef": a.aux_coef,
            "output_router_logits": False,
        })
    if a.arch == "mixtral":
        c.update({
            "num_local_experts": a.experts,
            "num_experts_per_tok": a.top_k,
            "router_aux_loss_coef": a.aux_coef,
            "router_jitter_noise": 0.0,
            "sliding_window": None,
            "output_router_logits": False,
        })
    return c


def parameter_layout(a):
    """[(name, shape, kind)] in module order; kind picks the initialisation."""
    h, V = a.hidden, a.vocab
    dh = a.head_dim if a.head_dim is not None else h // a.heads
    qd, kvd = a.heads * dh, a.kv_heads * dh
    out = [("model.embed_tokens.weight", [V, h], "w")]

    def swiglu(pre, names, ffn, bias=False):
        gate, up, down = names
        for n, shape in ((gate, [ffn, h]), (up, [ffn, h]), (down, [h, ffn])):
            out.append((f"{pre}{n}.weight", shape, "w"))
            if bias:
                out.append((f"{pre}{n}.bias", shape[:1], "b"))

    for i in range(a.layers):
        pre = f"model.layers.{i}."
        out.append((pre + "input_layernorm.weight", [h], "norm"))
        qkv_bias = a.arch in ("qwen2", "qwen2_moe") or (a.arch == "llama" and a.attention_bias)
        o_bias = a.arch == "llama" and a.attention_bias
        for proj, shape, kind, bias in (("q_proj", [qd, h], "qk", qkv_bias), ("k_proj", [kvd, h], "qk", qkv_bias),
                                        ("v_proj", [kvd, h], "w", qkv_bias), ("o_proj", [h, qd], "w", o_bias)):
            out.append((f"{pre}self_attn.{proj}.weight", shape, kind))
            if bias:
                out.append((f"{pre}self_attn.{proj}.bias", shape[:1], "b"))
        out.append((pre + "post_attention_layernorm.weight", [h], "norm"))
        if a.arch == "mixtral":
            out.append((pre + "block_sparse_moe.gate.weight", [a.experts, h], "router"))
            for e in range(a.experts):
                swiglu(f"{pre}block_sparse_moe.experts.{e}.", ("w1", "w3", "w2"), a.intermediate)
        elif a.arch == "qwen2_moe" and is_sparse_qwen2_moe_layer(a, i):
            out.append((pre + "mlp.gate.weight", [a.experts, h], "router"))
            for e in range(a.experts):
                swiglu(f"{pre}mlp.experts.{e}.", ("gate_proj", "up_proj", "down_proj"), a.moe_intermediate)
            swiglu(pre + "mlp.shared_expert.", ("gate_proj", "up_proj", "down_proj"), a.shared_intermediate)
            out.append((pre + "mlp.shared_expert_gate.weight", [1, h], "router"))
        else:
            swiglu(pre + "mlp.", ("gate_proj", "up_proj", "down_proj"), a.intermediate,
                   bias=a.arch == "llama" and a.mlp_bias)
    out.append(("model.norm.weight", [h], "norm"))
    if not a.tied:
        out.append(("lm_head.weight", [V, h], "w"))
    return out


def is_sparse_qwen2_moe_layer(a, i):
    return i not in a.mlp_only_layers and a.experts > 0 and (i + 1) % a.sparse_step == 0


def random_parameters(a):
    """{name: tensor in the requested dtype}, drawn in layout order from --seed
    (then the --lora-init adapters, f32, in layout order)."""
    g = torch.Generator().manual_seed(a.seed)
    std = {"w": 0.02, "qk": 0.08, "router": 0.08, "b": 0.05, "norm": 0.1}
    params = {}
    layout = parameter_layout(a)
    for name, shape, kind in layout:
        t = torch.randn(shape, generator=g, dtype=torch.float32) * std[kind]
        if kind == "norm":
            t = t + 1.0
        params[name] = t.to(DTYPES[a.dtype][0])
    if a.lora_init:
        r, targets = a.lora_init
        linears = [(n[: -len(".weight")], shape) for n, shape, _ in layout
                   if n.endswith(".weight") and len(shape) == 2 and n != "model.embed_tokens.weight"]
        if a.tied and "lm_head" in targets:  # (untied: lm_head.weight is in the layout)
            linears.append(("lm_head", [a.vocab, a.hidden]))  # tied: the embedding's values, a Linear in HF
        adapted = [(m, shape) for m, shape in linears if m.rsplit(".", 1)[-1] in targets]
        unmatched = sorted(set(targets) - {m.rsplit(".", 1)[-1] for m, _ in adapted})
        if unmatched:
            raise SystemExit(f"make_hf_model: --lora-init: no Linear is named {unmatched[0]}")
        for m, (out, inp) in adapted:
            bound = 1.0 / inp ** 0.5
            params[m + ".lora_A.weight"] = (torch.rand([r, inp], generator=g, dtype=torch.float32) * 2 - 1) * bound
            params[m + ".lora_B.weight"] = torch.randn([out, r], generator=g, dtype=torch.float32) * 0.05
    return params


# ---------------------------------------------------------------- safetensors

ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
             torch.int32: "I32"}


def tensor_bytes(t):
    """Little-endian bytes of a CPU tensor (bf16 through an int16 view)."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    assert sys.byteorder == "little"
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} in the given order; returns the tensor bytes written."""
    header = {"__metadata__": dict(metadata if metadata is not None else {"format": "pt"})}
    blobs, offset = [], 0
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors pads
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    return offset


def shard_cuts(sizes, n):
    """Start indices of n contiguous, non-empty runs of `sizes` of about equal sums."""
    total = sum(sizes)
    cuts, before, k = [0], 0, 1
    for j, s in enumerate(sizes):
        # Run k starts at the first tensor that lies past k/n of the bytes,
        # but leave at least one tensor for each remaining run.
        while k < n and (before >= k * total / n or len(sizes) - j <= n - k) and j > cuts[-1]:
            cuts.append(j)
            k += 1
        before += s
    assert len(cuts) == n, (cuts, n)
    return cuts


def write_weights(out, params, shards):
    names = sorted(params)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), {k: params[k] for k in names})
        return
    sizes = [params[k].numel() * params[k].element_size() for k in names]
    cuts = shard_cuts(sizes, shards) + [len(names)]
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[cuts[s] : cuts[s + 1]]
        total += write_safetensors(os.path.join(out, file), {k: params[k] for k in part})
        weight_map.update({k: file for k in part})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------- tokenizer

def copy_tokenizer(src, out, config):
    """Copies tokenizer.json / tokenizer_config.json from folder `src`; takes
    bos/eos ids from them when those fit the model's vocab."""
    files = [n for n in ("tokenizer.json", "tokenizer_config.json") if os.path.isfile(os.path.join(src, n))]
    if "tokenizer.json" not in files:
        raise SystemExit(f"make_hf_model: --tokenizer-from {src}: no tokenizer.json there")
    for n in files:
        shutil.copyfile(os.path.join(src, n), os.path.join(out, n))
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    ids = dict(tok.get("model", {}).get("vocab", {}))
    ids.update({t["content"]: t["id"] for t in tok.get("added_tokens", [])})
    size = max(ids.values()) + 1 if ids else 0
    if size > config["vocab_size"]:
        print(f"make_hf_model: note: the tokenizer has {size} ids, the model's vocab_size is {config['vocab_size']}",
              file=sys.stderr)
    if "tokenizer_config.json" in files:
        with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
            tc = json.load(f)
        for key in ("bos_token", "eos_token"):
            text = tc.get(key)
            if isinstance(text, dict):  # AddedToken form
                text = text.get("content")
            if text in ids and ids[text] < config["vocab_size"]:
                config[key + "_id"] = ids[text]


# ---------------------------------------------------------------- command line

def int_list(s):
    return [int(x) for x in s.split(",") if x.strip()] if s else []


def lora_init(spec):
    """'r=R,targets=A,B,...' -> (R, [A, B, ...])."""
    head, sep, rest = spec.partition(",targets=")
    if not head.startswith("r=") or not sep or not rest:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected r=R,targets=NAME[,NAME...]")
    try:
        r = int(head[2:])
    except ValueError:
        r = 0
    targets = rest.split(",")
    if r < 1 or not all(targets):
        raise argparse.ArgumentTypeError(f"{spec!r}: r must be an integer >= 1 and targets non-empty names")
    return r, targets


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, choices=sorted(ARCHS))
    ap.add_argument("--out", required=True, help="folder to write (created; existing files are overwritten)")
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tied", action="store_true", help="tie_word_embeddings: no lm_head.weight")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=None, help="written as head_dim (default: hidden / heads, unwritten)")
    ap.add_argument("--intermediate", type=int, default=96, help="dense MLP (mixtral: each expert's) hidden size")
    ap.add_argument("--vocab", type=int, default=320)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-intermediate", type=int, default=48)
    ap.add_argument("--shared-intermediate", type=int, default=80)
    ap.add_argument("--norm-topk", type=int, default=0, choices=(0, 1))
    ap.add_argument("--sparse-step", type=int, default=1)
    ap.add_argument("--mlp-only-layers", type=int_list, default=[], help="comma-separated layer indices")
    ap.add_argument("--attention-bias", type=int, default=0, choices=(0, 1), help="llama only")
    ap.add_argument("--mlp-bias", type=int, default=0, choices=(0, 1), help="llama only")
    ap.add_argument("--aux-coef", type=float, default=0.02, help="router_aux_loss_coef (MoE archs)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-6, help="rms_norm_eps")
    ap.add_argument("--tokenizer-from", help="folder holding tokenizer.json (and tokenizer_config.json)")
    ap.add_argument("--lora-init", type=lora_init, metavar="r=R,targets=NAME,...",
                    help="also write nonzero initial LoRA adapters for these Linears (see above)")
    ap.add_argument("--extra", action="append", default=[], metavar="KEY=JSON",
                    help="set config.json's KEY to the JSON value (config only; repeatable)")
    a = ap.parse_args(argv)
    dh = a.head_dim if a.head_dim is not None else (a.hidden // a.heads if a.heads > 0 else 0)
    problems = []
    if min(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab) <= 0:
        problems.append("sizes must be positive")
    elif a.heads % a.kv_heads:
        problems.append(f"--kv-heads {a.kv_heads} must divide --heads {a.heads}")
    elif a.head_dim is None and a.hidden % a.heads:
        problems.append(f"--heads {a.heads} must divide --hidden {a.hidden} (or give --head-dim)")
    elif dh <= 0 or dh % 2:
        problems.append(f"head dim {dh} must be positive and even (rotary pairs)")
    if a.arch in ("qwen2_moe", "mixtral"):
        if a.experts <= 0 or not 0 < a.top_k <= a.experts:
            problems.append(f"need --experts > 0 and 0 < --top-k <= --experts (got {a.experts}, {a.top_k})")
        if a.arch == "qwen2_moe" and (a.moe_intermediate <= 0 or a.shared_intermediate <= 0 or a.sparse_step <= 0):
            problems.append("--moe-intermediate, --shared-intermediate and --sparse-step must be positive")
    if a.arch != "llama" and (a.attention_bias or a.mlp_bias):
        problems.append("--attention-bias / --mlp-bias are llama options (qwen2 always has q/k/v biases, mixtral none)")
    if a.shards < 1:
        problems.append("--shards must be >= 1")
    if problems:
        ap.error("; ".join(problems))
    return a


def main(argv=None):
    a = parse_args(argv)
    config = build_config(a)
    params = random_parameters(a)
    if a.shards > len(params):
        raise SystemExit(f"make_hf_model: --shards {a.shards} is more than the {len(params)} tensors")
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer_from:
        copy_tokenizer(a.tokenizer_from, a.out, config)
    for kv in a.extra:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise SystemExit(f"make_hf_model: --extra {kv!r}: expected KEY=JSONVALUE")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError as e:
            raise SystemExit(f"make_hf_model: --extra {kv!r}: the value is not JSON ({e})")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    write_weights(a.out, params, a.shards)
    n = sum(t.numel() for t in params.values())
    print(f"make_hf_model: {a.out}: {a.arch} {a.dtype}, {len(params)} tensors, {n} parameters, "
          f"{max(a.shards, 1)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
