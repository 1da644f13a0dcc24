#!/usr/bin/python3
"""Self-check of make_hf_model.py and hf_reference.py (a few seconds, CPU).

For each architecture (llama, qwen2, qwen2_moe, mixtral; f32/bf16/f16; one
file or shards; tied or not; GQA; head_dim != hidden/heads; biases; dense and
sparse qwen2_moe layers) it writes a tiny folder with make_hf_model.py, reads
it back with its own reader (torch.frombuffer, not the reference's numpy
path), and computes a fake dump in float32 along different code paths from
the reference's:

  embedding    one-hot @ table
  RMSNorm      x / sqrt(sum(x^2)/h + eps) * w
  rotary       complex multiplication of (x[:Dh/2] + i x[Dh/2:]) by e^(i pos f)
  attention    kv heads repeat_interleave'd, einsum, a tril mask
  MoE          a loop over tokens: argsort of the probabilities, experts one
               by one; aux from Python counts
  cross-entropy  log_softmax and gather

The reference must accept each such dump (exit 0), reject it (exit 1) once one
gradient is perturbed by 1e-3 of its largest value, and reject dumps with a
changed parameter bit, a missing or extra key, a misshapen gradient or a
perturbed loss; folders it cannot model must exit 2.

LoRA and frozen parameters (--lora / --freeze): fake dumps whose adapted
Linears use the merged weight W + (alpha/r) B @ A (the reference adds the
low-rank term to x W^T instead), of folders with make_hf_model.py
--lora-init adapters (every projection, the routers, shared_expert_gate and a
tied lm_head included) and of fresh PEFT-initialised adapters, with gradients
of the adapters only; and dumps with a frozen embedding. The reference must
accept them, and reject a perturbed adapter gradient, a gradient of a frozen
parameter, a missing adapter gradient, another alpha, r or target list, a
fresh B that is not zero; --lora without alpha, with dropout, or missing
where the dump has adapters, and a --freeze glob matching nothing exit 2. Also checks the folder
layout (names, shapes, config keys, shard names, index totals, header
alignment, determinism in the seed).

Prints one line per check and `N passed, M failed` last; exit 0 iff none failed.
"""

import contextlib
import io
import json
import math
import os
import struct
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402
import make_hf_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = [0, 0]


def check(cond, what, detail=""):
    RESULTS[0 if cond else 1] += 1
    print(f"{'ok  ' if cond else 'FAIL'} {what}" + (f"  ({detail})" if detail and not cond else ""))
    return cond


# ---------------------------------------------------------------- folder I/O

def read_st(path):
    """(header, {name: float32 or int64 tensor}) through torch.frombuffer."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n].decode())
    dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        buf = bytearray(data[8 + n + b : 8 + n + e])
        t = torch.frombuffer(buf, dtype=dt[v["dtype"]]) if buf else torch.empty(0, dtype=dt[v["dtype"]])
        t = t.reshape(v["shape"])
        out[k] = t if v["dtype"] == "I64" else t.float()
    return header, n, out


def read_model(folder):
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors"))
    params = {}
    for x in files:
        params.update(read_st(os.path.join(folder, x))[2])
    return config, params


def make(tmp, name, argv):
    out = os.path.join(tmp, name)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        make_hf_model.main(["--out", out] + argv)
    return out


def reference(folder, dump, *flags):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = hf_reference.main(["--model", folder, dump, *flags])
    return rc, buf.getvalue()


# ---------------------------------------------------------------- the fake dump (float32)

def fake_forward(c, p, tokens, lora_scaling=None):
    """(ce, aux) in float32, along other code paths than hf_reference's (a
    LoRA-adapted Linear through its merged weight W + scaling * B @ A)."""
    kind = c["model_type"]
    h, V, nh = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    dh = c.get("head_dim") or h // nh
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    B, S = inputs.shape

    def norm(x, w):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) / h + eps) * w

    def merged(w, name):
        if name + ".lora_A.weight" not in p:
            return w
        return w + lora_scaling * (p[name + ".lora_B.weight"] @ p[name + ".lora_A.weight"])

    def lin(x, name):
        return F.linear(x, merged(p[name + ".weight"], name), p.get(name + ".bias"))

    pos = torch.arange(S, dtype=torch.float32)
    freq = torch.tensor([theta ** (-2.0 * j / dh) for j in range(dh // 2)], dtype=torch.float32)
    rot = torch.polar(torch.ones(S, dh // 2), pos[:, None] * freq[None, :])  # [S, Dh/2]

    def rope(x):  # x [B, S, heads, Dh]
        z = torch.complex(x[..., : dh // 2], x[..., dh // 2 :]) * rot[None, :, None, :]
        return torch.cat([z.real, z.imag], -1)

    def attn(x, pre):
        q = rope(lin(x, pre + "q_proj").reshape(B, S, nh, dh))
        k = rope(lin(x, pre + "k_proj").reshape(B, S, nkv, dh)).repeat_interleave(nh // nkv, dim=2)
        v = lin(x, pre + "v_proj").reshape(B, S, nkv, dh).repeat_interleave(nh // nkv, dim=2)
        sc = torch.einsum("bqhd,bkhd->bhqk", q, k) * dh ** -0.5
        sc = torch.where(torch.tril(torch.ones(S, S, dtype=torch.bool)), sc, torch.tensor(-1e30))
        o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(sc, -1), v)
        return lin(o.reshape(B, S, nh * dh), pre + "o_proj")

    def glu(x, g, u, d):
        return lin(F.silu(lin(x, g)) * lin(x, u), d)

    def sparse(i):
        if kind == "mixtral":
            return True
        if kind != "qwen2_moe":
            return False
        return i not in (c.get("mlp_only_layers") or []) and (i + 1) % c["decoder_sparse_step"] == 0

    def moe(x, pre):
        E = c.get("num_experts") or c.get("num_local_experts")
        K = c["num_experts_per_tok"]
        renorm = kind == "mixtral" or c.get("norm_topk_prob", False)
        rows = x.reshape(B * S, h)
        probs = torch.softmax(lin(rows, pre + "gate"), -1)
        outs, count = [], [0] * E
        for t in range(B * S):
            chosen = torch.argsort(probs[t], descending=True)[:K].tolist()
            w = probs[t, chosen]
            if renorm:
                w = w / w.sum()
            acc = torch.zeros(h)
            for j, e in enumerate(chosen):
                count[e] += 1
                if kind == "mixtral":
                    y = glu(rows[t], *(f"{pre}experts.{e}.{n}" for n in ("w1", "w3", "w2")))
                else:
                    y = glu(rows[t], *(f"{pre}experts.{e}.{n}_proj" for n in ("gate", "up", "down")))
                acc = acc + w[j] * y
            if kind == "qwen2_moe":
                s = glu(rows[t], *(f"{pre}shared_expert.{n}_proj" for n in ("gate", "up", "down")))
                acc = acc + torch.sigmoid(lin(rows[t], pre + "shared_expert_gate")) * s
            outs.append(acc)
        aux = E * sum(count[e] / (B * S * K) * probs[:, e].mean() for e in range(E))
        return torch.stack(outs).reshape(B, S, h), aux

    x = F.one_hot(inputs, V).float() @ p["model.embed_tokens.weight"]
    aux = torch.zeros(())
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        x = x + attn(norm(x, p[pre + "input_layernorm.weight"]), pre + "self_attn.")
        y = norm(x, p[pre + "post_attention_layernorm.weight"])
        if sparse(i):
            y, a = moe(y, pre + ("block_sparse_moe." if kind == "mixtral" else "mlp."))
            aux = aux + a
        else:
            y = glu(y, *(f"{pre}mlp.{n}_proj" for n in ("gate", "up", "down")))
        x = x + y
    x = norm(x, p["model.norm.weight"])
    head = p["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else p["lm_head.weight"]
    logp = torch.log_softmax(x @ merged(head, "lm_head").T, -1)
    ce = -logp.gather(-1, targets[..., None]).mean()
    return ce, aux


def fake_dump(folder, path, batch=2, seq=12, seed=1, lora_scaling=None, fresh=None, frozen=lambda name: False):
    """Writes a dump of the folder's model as remat would (float32); returns its tensors.

    lora_scaling: the folder's adapters (and `fresh`, {name: tensor}, adapters
    the folder does not hold) train, nothing else; frozen(name): no gradient."""
    c, params = read_model(folder)
    params.update(fresh or {})
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, c["vocab_size"], (batch, seq + 1), generator=g)
    trains = [k for k in sorted(params) if (lora_scaling is None or ".lora_" in k) and not frozen(k)]
    p = {k: v.clone().requires_grad_(k in trains) for k, v in params.items()}
    ce, aux = fake_forward(c, p, tokens, lora_scaling)
    moe = c["model_type"] in ("qwen2_moe", "mixtral")
    (ce + (c["router_aux_loss_coef"] if moe else 0.0) * aux).backward()
    out = {k: params[k] for k in sorted(params)}
    out["batch.tokens"] = tokens
    out["loss.ce"] = ce.detach()
    out["loss.aux"] = aux.detach().reshape(1)  # [1] here, 0-dim for ce: both spellings
    for k in trains:
        out["grad." + k] = p[k].grad if p[k].grad is not None else torch.zeros_like(params[k])
    write_dump(path, out)
    return out


def write_dump(path, tensors):
    make_hf_model.write_safetensors(path, tensors, {"format": "pt", "config": "{}"})


# ---------------------------------------------------------------- tests

MODELS = [  # name, make_hf_model arguments, a gradient to perturb
    ("llama", ["--arch", "llama", "--seed", "3"], "model.layers.0.self_attn.q_proj.weight"),
    ("llama-bias-hd24-tied-bf16-3shards",
     ["--arch", "llama", "--attention-bias", "1", "--mlp-bias", "1", "--head-dim", "24", "--tied",
      "--dtype", "bf16", "--shards", "3", "--seed", "4"], "model.layers.1.self_attn.o_proj.bias"),
    ("qwen2-f16-tied-mqa-2shards",
     ["--arch", "qwen2", "--dtype", "f16", "--tied", "--kv-heads", "1", "--shards", "2", "--seed", "5"],
     "model.layers.1.self_attn.k_proj.bias"),
    ("qwen2_moe-mlp_only0",
     ["--arch", "qwen2_moe", "--layers", "3", "--mlp-only-layers", "0", "--seed", "6"],
     "model.layers.1.mlp.shared_expert_gate.weight"),
    ("qwen2_moe-step2-normtopk-bf16-mha",
     ["--arch", "qwen2_moe", "--layers", "4", "--sparse-step", "2", "--norm-topk", "1", "--dtype", "bf16",
      "--kv-heads", "4", "--experts", "6", "--top-k", "3", "--seed", "7"], "model.layers.3.mlp.gate.weight"),
    ("mixtral-2shards",
     ["--arch", "mixtral", "--shards", "2", "--seed", "8", "--aux-coef", "0.05"],
     "model.layers.0.block_sparse_moe.gate.weight"),
    ("mixtral-topk=E-hd8",
     ["--arch", "mixtral", "--experts", "2", "--top-k", "2", "--heads", "8", "--kv-heads", "2", "--head-dim", "8",
      "--seed", "9"], "model.layers.1.block_sparse_moe.experts.1.w2.weight"),
]


def perturbed(tensors, **changes):
    out = dict(tensors)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def test_reference(tmp):
    for name, argv, grad_name in MODELS:
        folder = make(tmp, name, argv)
        path = os.path.join(tmp, name + ".safetensors")
        t = fake_dump(folder, path)
        rc, text = reference(folder, path)
        check(rc == 0, f"{name}: reference accepts the float32 dump", text)
        if name == "llama":
            print("     " + text.strip().replace("\n", "\n     "))
        if "moe" in name or "mixtral" in name:
            check("info" in text and "MoE layers" in text, f"{name}: routing margin reported", text)

        g = t["grad." + grad_name].clone()
        flat = g.reshape(-1)
        j = int(flat.abs().argmin())  # the perturbation must show even where the value is small
        flat[j] += 1e-3 * g.abs().max()
        write_dump(path, perturbed(t, **{"grad." + grad_name: g}))
        rc, text = reference(folder, path)
        check(rc == 1 and f"FAIL grad.{grad_name} " in text, f"{name}: a gradient off by 1e-3 fails", text)

        if name not in ("llama", "qwen2_moe-mlp_only0", "llama-bias-hd24-tied-bf16-3shards"):
            continue
        # Broken dumps of this model.
        w = next(k for k in sorted(t) if k.startswith("model.layers.") and k.endswith("norm.weight"))
        bumped = t[w].clone()
        bumped.view(torch.int32).reshape(-1)[1] += 1  # one ulp
        cases = [
            ("a parameter one ulp off", {w: bumped}, f"first {w} at [1]"),
            ("a missing gradient", {"grad." + w: None}, f"lacks grad.{w}"),
            ("a missing parameter", {w: None}, f"lacks parameter {w}"),
            ("a misshapen gradient", {"grad." + w: torch.zeros(3)}, f"grad.{w} is [3]"),
            ("an unknown key", {"extra.thing": torch.zeros(1)}, "extra.thing"),
            ("loss.ce off by 1e-4", {"loss.ce": t["loss.ce"] * (1 + 1e-4)}, "FAIL loss.ce"),
        ]
        if "moe" in name:
            cases.append(("loss.aux off by 1e-4", {"loss.aux": t["loss.aux"] * (1 + 1e-4)}, "FAIL loss.aux"))
        else:
            cases.append(("a nonzero aux on a dense model", {"loss.aux": torch.tensor(1e-3)}, "FAIL loss.aux"))
        if "tied" in name:
            cases.append(("a gradient of lm_head on a tied model",
                          {"grad.lm_head.weight": torch.zeros(320, 64)}, "grad.lm_head.weight, a gradient of no"))
            cases.append(("an lm_head parameter on a tied model",
                          {"lm_head.weight": torch.zeros(320, 64)}, "lm_head.weight, which the folder does not"))
        for what, change, needle in cases:
            write_dump(path, perturbed(t, **change))
            rc, text = reference(folder, path)
            check(rc == 1 and needle in text, f"{name}: {what} fails", text)


def test_refusals(tmp):
    base = ["--arch", "llama"]
    cases = [
        ("rope_scaling", base + ["--extra", 'rope_scaling={"type":"linear","factor":2.0}'], "rope_scaling"),
        ("gelu", base + ["--extra", 'hidden_act="gelu"'], "hidden_act"),
        ("attention dropout", base + ["--extra", "attention_dropout=0.1"], "attention_dropout"),
        ("qwen2 sliding window", ["--arch", "qwen2", "--extra", "use_sliding_window=true"], "use_sliding_window"),
        ("router jitter", ["--arch", "mixtral", "--extra", "router_jitter_noise=0.01"], "router_jitter_noise"),
        ("unknown architecture", base + ["--extra", 'architectures=["GPT2LMHeadModel"]',
                                         "--extra", 'model_type="gpt2"'], "GPT2LMHeadModel"),
        ("config/weights mismatch", base + ["--extra", "vocab_size=321"], "does not match its config"),
        ("tied config, lm_head present", base + ["--extra", "tie_word_embeddings=true"], "lm_head.weight"),
    ]
    for what, argv, needle in cases:
        folder = make(tmp, "refuse", argv)
        rc, text = reference(folder, os.path.join(tmp, "no-such-dump.safetensors"))
        check(rc == 2 and needle in text, f"refuses {what} (exit 2)", text)


def test_layout(tmp):
    # qwen2_moe: sparse iff i not in mlp_only_layers and (i+1) % step == 0.
    folder = make(tmp, "layout", ["--arch", "qwen2_moe", "--layers", "4", "--sparse-step", "2",
                                  "--mlp-only-layers", "3", "--head-dim", "24", "--shards", "4"])
    c, p = read_model(folder)
    sparse = sorted({int(k.split(".")[2]) for k in p if ".mlp.experts." in k})
    check(sparse == [1], "qwen2_moe sparse layers follow mlp_only_layers and decoder_sparse_step", sparse)
    want = {
        "model.layers.1.self_attn.q_proj.weight": [96, 64], "model.layers.1.self_attn.q_proj.bias": [96],
        "model.layers.1.self_attn.k_proj.weight": [48, 64], "model.layers.1.self_attn.v_proj.bias": [48],
        "model.layers.1.self_attn.o_proj.weight": [64, 96], "model.layers.1.mlp.gate.weight": [4, 64],
        "model.layers.1.mlp.experts.3.down_proj.weight": [64, 48],
        "model.layers.1.mlp.shared_expert.up_proj.weight": [80, 64],
        "model.layers.1.mlp.shared_expert_gate.weight": [1, 64], "model.layers.0.mlp.gate_proj.weight": [96, 64],
        "model.layers.3.mlp.down_proj.weight": [64, 96], "lm_head.weight": [320, 64], "model.norm.weight": [64],
    }
    got = {k: list(p[k].shape) for k in want if k in p}
    check(got == want, "qwen2_moe names and shapes (head_dim 24)", got)
    check("model.layers.1.self_attn.o_proj.bias" not in p and len(p) == 4 * 9 + 3 * 3 + (1 + 4 * 3 + 3 + 1) + 3,
          "qwen2_moe has no o_proj bias and no other tensors", len(p))
    files = sorted(os.listdir(folder))
    shards = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    check(files == sorted(["config.json", "model.safetensors.index.json"] + shards), "shard file names", files)
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    total, names, aligned, meta = 0, {}, True, True
    for s in shards:
        header, n, t = read_st(os.path.join(folder, s))
        aligned &= n % 8 == 0
        meta &= header["__metadata__"] == {"format": "pt"}
        total += sum(e - b for b, e in (v["data_offsets"] for k, v in header.items() if k != "__metadata__"))
        names.update({k: s for k in t})
    check(index["weight_map"] == names and sorted(names) == sorted(p), "index weight_map names every tensor's shard")
    check(index["metadata"]["total_size"] == total == sum(4 * v.numel() for v in p.values()),
          "index total_size is the tensors' bytes", (index["metadata"], total))
    check(aligned and meta, "headers 8-byte aligned with __metadata__ {format: pt}")
    order = [k for s in shards for k in read_st(os.path.join(folder, s))[2]]
    check(order == sorted(p), "tensors split across shards in name order")

    keys = {
        "llama": ["attention_bias", "mlp_bias", "pretraining_tp"],
        "qwen2": ["use_sliding_window", "sliding_window", "max_window_layers"],
        "qwen2_moe": ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                      "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
                      "output_router_logits", "use_sliding_window"],
        "mixtral": ["num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "router_jitter_noise",
                    "sliding_window", "output_router_logits"],
    }
    common = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
              "vocab_size", "max_position_embeddings", "hidden_act", "initializer_range", "bos_token_id",
              "eos_token_id", "torch_dtype", "use_cache", "transformers_version", "rope_scaling",
              "attention_dropout"]
    archs = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
             "mixtral": "MixtralForCausalLM"}
    for arch, extra in keys.items():
        folder = make(tmp, "keys-" + arch, ["--arch", arch, "--dtype", "bf16"])
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        missing = [k for k in common + extra if k not in c]
        check(not missing and c["architectures"] == [archs[arch]] and c["model_type"] == arch
              and "head_dim" not in c and c["torch_dtype"] == "bfloat16" and c["rope_scaling"] is None,
              f"{arch} config.json keys", missing)
        files = sorted(os.listdir(folder))
        check(files == ["config.json", "model.safetensors"], f"{arch} writes one model.safetensors", files)

    a = make(tmp, "seed-a", ["--arch", "mixtral", "--seed", "11"])
    b = make(tmp, "seed-b", ["--arch", "mixtral", "--seed", "11"])
    d = make(tmp, "seed-d", ["--arch", "mixtral", "--seed", "12"])

    def blob(x):
        with open(os.path.join(x, "model.safetensors"), "rb") as f:
            return f.read()
    check(blob(a) == blob(b) != blob(d), "the same seed gives the same bytes, another seed others")
    _, p = read_model(a)
    check(all(k.startswith(("model.", "lm_head.")) for k in p)
          and list(p["model.layers.1.block_sparse_moe.experts.3.w2.weight"].shape) == [64, 96]
          and list(p["model.layers.1.block_sparse_moe.experts.3.w3.weight"].shape) == [96, 64],
          "mixtral expert names and shapes")

    tok = os.path.join(REPO, "tests", "tokenizer", "data", "qwen3")
    if os.path.isdir(tok):
        folder = make(tmp, "tok", ["--arch", "qwen2", "--tokenizer-from", tok, "--vocab", "151669",
                                   "--hidden", "8", "--heads", "2", "--kv-heads", "1", "--tied"])
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        same = all(open(os.path.join(folder, n), "rb").read() == open(os.path.join(tok, n), "rb").read()
                   for n in ("tokenizer.json", "tokenizer_config.json"))
        check(same and c["eos_token_id"] == 151645, "--tokenizer-from copies the files and takes eos <|im_end|>",
              c["eos_token_id"])


ALL7 = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def test_lora(tmp):
    # Adapters the folder holds (nonzero B), on every kind of Linear the models have.
    cases = [
        ("llama-tied-gqa", ["--arch", "llama", "--tied", "--seed", "21"], ALL7 + ",lm_head",
         "model.layers.1.self_attn.k_proj.lora_A.weight"),
        ("qwen2_moe-routers", ["--arch", "qwen2_moe", "--layers", "3", "--mlp-only-layers", "0", "--seed", "22",
                               "--dtype", "bf16", "--shards", "2"],
         ALL7 + ",gate,shared_expert_gate,lm_head", "model.layers.2.mlp.experts.1.down_proj.lora_A.weight"),
        ("mixtral-w123", ["--arch", "mixtral", "--seed", "23"], "q_proj,w1,w2,w3,gate",
         "model.layers.0.block_sparse_moe.gate.lora_A.weight"),
    ]
    for name, argv, targets, perturb in cases:
        folder = make(tmp, "lora-" + name, argv + ["--lora-init", "r=3,targets=" + targets])
        path = os.path.join(tmp, f"lora-{name}.safetensors")
        t = fake_dump(folder, path, lora_scaling=7.0 / 3)
        spec = f"r=3,alpha=7,targets={targets}"
        rc, text = reference(folder, path, "--lora", spec)
        check(rc == 0 and "ok   lora: " in text, f"{name}: reference accepts the float32 LoRA dump ({targets})", text)
        if name.startswith("llama"):
            print("     " + text.strip().replace("\n", "\n     "))
        g = t["grad." + perturb].clone()
        flat = g.reshape(-1)
        flat[int(flat.abs().argmin())] += 1e-3 * g.abs().max()
        write_dump(path, perturbed(t, **{"grad." + perturb: g}))
        rc, text = reference(folder, path, "--lora", spec)
        check(rc == 1 and f"FAIL grad.{perturb} " in text, f"{name}: an adapter gradient off by 1e-3 fails", text)
        if not name.startswith("llama"):
            continue
        base = "model.layers.0.self_attn.q_proj.weight"
        a = "model.layers.0.mlp.up_proj.lora_A.weight"
        wrong = [
            ("a gradient of a frozen base weight", t, ["--lora", spec],
             {"grad." + base: torch.zeros(64, 64)}, f"grad.{base}, but {base} is frozen"),
            ("a missing adapter gradient", t, ["--lora", spec], {"grad." + a: None}, f"lacks grad.{a}"),
            ("alpha 8 for 7", t, ["--lora", "alpha=8"], {}, "FAIL grad."),
            ("r=4 for adapters of rank 3", t, ["--lora", "r=4,alpha=7"], {}, "rank 3, --lora says r=4"),
            ("targets without lm_head", t, ["--lora", "alpha=7,targets=" + ALL7], {},
             "Linears not targeted have one, e.g. lm_head"),
            ("a target with no adapters", t, ["--lora", f"alpha=7,targets={targets},w1"], {},
             "target w1 names no Linear"),
            ("an adapter without its B", t, ["--lora", "alpha=7"],
             {"model.layers.0.mlp.up_proj.lora_B.weight": None, "grad.model.layers.0.mlp.up_proj.lora_B.weight": None},
             "the dump lacks parameter model.layers.0.mlp.up_proj.lora_B.weight"),
        ]
        for what, tensors, flags, change, needle in wrong:
            write_dump(path, perturbed(tensors, **change))
            rc, text = reference(folder, path, *flags)
            check(rc == 1 and needle in text, f"{name}: {what} fails", text)
        write_dump(path, t)
        for what, flags, needle in [("no --lora", [], "give --lora alpha=A"),
                                    ("--lora without alpha", ["--lora", "r=3"], "give alpha="),
                                    ("--lora dropout=0.1", ["--lora", "alpha=7,dropout=0.1"], "dropout"),
                                    ("a malformed --lora", ["--lora", "alpha=7,rank=3"], "unknown key 'rank'")]:
            rc, text = reference(folder, path, *flags)
            check(rc == 2 and needle in text, f"{name}: {what} is refused (exit 2)", text)

    # Fresh adapters (the folder holds none): PEFT's initialisation, taken
    # from the dump. The same seed without --lora-init: the same base weights.
    folder = make(tmp, "fresh", ["--arch", "llama", "--tied", "--seed", "21"])
    g = torch.Generator().manual_seed(5)
    fresh = {}
    for i in range(2):
        for proj, out in (("q_proj", 64), ("v_proj", 32)):
            m = f"model.layers.{i}.self_attn.{proj}"
            fresh[m + ".lora_A.weight"] = (torch.rand(2, 64, generator=g) * 2 - 1) / 8
            fresh[m + ".lora_B.weight"] = torch.zeros(out, 2)
    path = os.path.join(tmp, "fresh.safetensors")
    t = fake_dump(folder, path, lora_scaling=2.0, fresh=fresh)
    rc, text = reference(folder, path, "--lora", "r=2,alpha=4,targets=q_proj,v_proj")
    check(rc == 0 and "4 fresh (B zero, A within +-1/sqrt(in))" in text,
          "fresh adapters: accepted (B zero, A within PEFT's bound; A's gradient zero)", text)
    b = "model.layers.1.self_attn.v_proj.lora_B.weight"
    for what, change, needle in [
        ("a fresh B that is not zero", {b: torch.full((32, 2), 1e-3)}, f"{b} is not zero"),
        ("a fresh A past 1/sqrt(in)", {b.replace("v_proj.lora_B", "q_proj.lora_A"): torch.full((2, 64), 0.2)},
         "within +-1/sqrt(in)")]:
        write_dump(path, perturbed(t, **change))
        rc, text = reference(folder, path, "--lora", "alpha=4")
        check(rc == 1 and needle in text, f"fresh adapters: {what} fails", text)

    # Frozen parameters, no adapters.
    for name, argv, glob, frozen in [
        ("llama-tied", ["--arch", "llama", "--tied", "--seed", "24"], "model.embed_tokens.*",
         lambda k: k.startswith("model.embed_tokens.")),
        ("qwen2_moe", ["--arch", "qwen2_moe", "--layers", "3", "--seed", "25"], "model.layers.[0-1].*,lm_head.weight",
         lambda k: k.startswith(("model.layers.0.", "model.layers.1.", "lm_head."))),
    ]:
        folder = make(tmp, "freeze-" + name, argv)
        path = os.path.join(tmp, f"freeze-{name}.safetensors")
        t = fake_dump(folder, path, frozen=frozen)
        rc, text = reference(folder, path, "--freeze", glob)
        check(rc == 0 and " frozen, none with one" in text, f"{name}: --freeze {glob}: accepted", text)
        rc, text = reference(folder, path)
        check(rc == 1 and "FAIL the dump lacks grad." in text, f"{name}: the same dump without --freeze fails", text)
    rc, text = reference(folder, path, "--freeze", "model.layers.[0-1].*,model.layers.[3-9].*")
    check(rc == 2 and "'model.layers.[3-9].*' matches no parameter" in text, "a --freeze glob matching nothing: exit 2",
          text)
    names = ["model.layers.5.mlp.up_proj.weight", "model.layers.11.x", "model.layers.12.x", "model.layers.1x.y",
             "model.layers.0.self_attn.q_proj.weight", "xmodel.layers.3.a"]
    rx = hf_reference.glob_regex("model.layers.[0-11].*")
    got = [bool(rx.match(n)) for n in names]
    check(got == [True, True, False, False, True, False], "glob [0-11] is a number range over the whole name", got)
    rx = hf_reference.glob_regex("model.layers.?.self_attn.*")
    check(bool(rx.match(names[4])) and not rx.match(names[1]), "glob ? is one character")


def main():
    torch.set_num_threads(min(4, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        test_layout(tmp)
        test_reference(tmp)
        test_refusals(tmp)
        test_lora(tmp)
    print(f"{RESULTS[0]} passed, {RESULTS[1]} failed")
    return 0 if RESULTS[1] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
