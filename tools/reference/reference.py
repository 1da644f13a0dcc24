#!/usr/bin/python3
"""Independent PyTorch reference for `./remat dump` files.

Reads a dump (safetensors: parameters under Hugging Face Llama / Qwen-MoE
names, batch.tokens, loss.ce, loss.aux, grad.<name>), rebuilds the same
decoder in PyTorch (float64 on the CPU; dense or mixture-of-experts blocks as
the config says), computes the loss and every parameter gradient, and reports
the largest differences:

  loss.ce   relative difference |remat - torch| / |torch|
  loss.aux  relative difference (absolute when torch's aux is 0: dense models)
  grad.X    max |remat - torch| / max |torch|

The gradients are those of ce + aux_coef * aux + z_coef * z, where aux is the
sum over MoE blocks of the load-balancing loss and z the sum of their router
z-losses.

Exit status 0 when every difference is within the tolerances (--loss-rtol,
--aux-rtol / --aux-atol, --grad-rtol), 1 otherwise, 2 when the dump's config
is one the reference cannot reproduce (random routing, expert capacity
limits). Uses Debian's python3-torch; no network.
"""

import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_}

# Config keys that are counts (the JSON may spell them 8 or 8.0), and the
# defaults of models/config.h for the MoE keys a dense dump may leave out.
INT_KEYS = ("vocab", "d_model", "n_layers", "n_heads", "ffn", "seq", "batch",
            "experts", "top_k", "moe_ffn", "shared", "dense_first")
DEFAULTS = {"experts": 0, "top_k": 0, "moe_ffn": 0, "shared": 0, "dense_first": 0,
            "aux_coef": 0.01, "z_coef": 0.0, "capacity_factor": 0.0, "random_routing": False}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":
            raw = np.frombuffer(data[base + b : base + e], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[base + b : base + e], dtype=DTYPES[info["dtype"]])
        tensors[name] = torch.from_numpy(arr.copy().reshape(info["shape"]))
    return tensors, meta


def load_config(meta):
    cfg = dict(DEFAULTS)
    cfg.update(json.loads(meta["config"]))
    for k in INT_KEYS:
        cfg[k] = int(cfg[k])
    return cfg


def unsupported(cfg):
    """Why the reference cannot reproduce this config's dump, or None."""
    if cfg["experts"] > 0 and bool(cfg["random_routing"]):
        return "random routing draws its own expert choices; the reference cannot reproduce them"
    if cfg["experts"] > 0 and float(cfg["capacity_factor"]) > 0:
        return (f"capacity_factor {cfg['capacity_factor']:g} limits the tokens per expert; "
                "the reference models dropless routing only (capacity_factor 0)")
    return None


def is_moe_layer(cfg, i):
    return cfg["experts"] > 0 and i >= cfg["dense_first"]


def expected_parameters(cfg):
    """Name -> shape of every parameter the model of `cfg` has."""
    d, ffn, vocab = cfg["d_model"], cfg["ffn"], cfg["vocab"]

    def swiglu(prefix, hidden):
        return {prefix + "gate_proj.weight": [hidden, d], prefix + "up_proj.weight": [hidden, d],
                prefix + "down_proj.weight": [d, hidden]}

    shapes = {"model.embed_tokens.weight": [vocab, d], "model.norm.weight": [d], "lm_head.weight": [vocab, d]}
    for i in range(cfg["n_layers"]):
        pre = f"model.layers.{i}."
        shapes[pre + "input_layernorm.weight"] = [d]
        shapes[pre + "post_attention_layernorm.weight"] = [d]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[pre + f"self_attn.{proj}.weight"] = [d, d]
        if not is_moe_layer(cfg, i):
            shapes.update(swiglu(pre + "mlp.", ffn))
            continue
        shapes[pre + "mlp.gate.weight"] = [cfg["experts"], d]
        for e in range(cfg["experts"]):
            shapes.update(swiglu(pre + f"mlp.experts.{e}.", cfg["moe_ffn"]))
        if cfg["shared"] > 0:
            shapes.update(swiglu(pre + "mlp.shared_expert.", cfg["moe_ffn"] * cfg["shared"]))
    return shapes


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, theta):
    # x [B, H, S, D], "rotate half" convention.
    s, d = x.shape[-2], x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
    ang = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(x, p, prefix, cfg):
    b, s, d = x.shape
    h = cfg["n_heads"]
    dh = d // h

    def heads(t):
        return t.view(b, s, h, dh).transpose(1, 2)

    q = heads(x @ p[prefix + "q_proj.weight"].T)
    k = heads(x @ p[prefix + "k_proj.weight"].T)
    v = heads(x @ p[prefix + "v_proj.weight"].T)
    q, k = rotary(q, cfg["rope_theta"]), rotary(k, cfg["rope_theta"])
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    o = torch.softmax(scores, -1) @ v
    o = o.transpose(1, 2).reshape(b, s, d)
    return o @ p[prefix + "o_proj.weight"].T


def mlp(x, p, prefix):
    # SwiGLU: the dense MLP, and also each routed expert and the shared expert.
    g = x @ p[prefix + "gate_proj.weight"].T
    u = x @ p[prefix + "up_proj.weight"].T
    return (torch.nn.functional.silu(g) * u) @ p[prefix + "down_proj.weight"].T


def moe(h, p, prefix, cfg):
    """Dropless top-k mixture of experts on h [B, S, d].

    Returns (output [B, S, d], load-balancing loss, router z-loss, routing
    margin). The margin is the smallest gap, over tokens, between the k-th and
    the (k+1)-th router probability (inf when every expert is selected): when
    it is tiny, float32 rounding on the remat side may pick another expert.
    """
    b, s, d = h.shape
    n_exp, top_k = cfg["experts"], cfg["top_k"]
    t = h.reshape(b * s, d)
    n_tok = t.shape[0]

    # Router: softmax over the experts, top-k by probability, the chosen
    # probabilities renormalised to sum to 1 (the gradient flows through them).
    logits = t @ p[prefix + "gate.weight"].T  # [T, E]
    probs = torch.softmax(logits, -1)
    idx = torch.topk(probs, top_k, dim=-1, largest=True, sorted=True).indices  # [T, K]
    w = probs.gather(1, idx)
    w = w / w.sum(-1, keepdim=True)

    # Routed experts: each runs on the tokens that chose it, and its output,
    # scaled by the token's weight for it, is added to those tokens' rows.
    y = torch.zeros_like(t)
    for e in range(n_exp):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue  # no tokens: this expert's weights get a zero gradient
        out = mlp(t[tok], p, prefix + f"experts.{e}.")
        y = y.index_add(0, tok, out * w[tok, slot].unsqueeze(-1))

    # Shared expert: every token, unweighted.
    if cfg["shared"] > 0:
        y = y + mlp(t, p, prefix + "shared_expert.")

    # Load balancing: E * sum_e f_e * P_e, f_e the fraction of the T*K
    # (token, slot) pairs sent to expert e (a constant), P_e the mean router
    # probability of e (differentiable).
    counts = torch.bincount(idx.reshape(-1), minlength=n_exp).to(t.dtype)
    aux = n_exp * ((counts / (n_tok * top_k)) * probs.mean(0)).sum()

    # Router z-loss: mean over tokens of logsumexp(logits)^2.
    z = torch.logsumexp(logits, -1).pow(2).mean()

    margin = math.inf
    if top_k < n_exp:
        with torch.no_grad():
            top = torch.topk(probs, top_k + 1, dim=-1).values
            margin = (top[:, top_k - 1] - top[:, top_k]).min().item()
    return y.reshape(b, s, d), aux, z, margin


def forward(p, tokens, cfg):
    """Returns (cross-entropy, summed aux loss, summed z-loss, routing margins per MoE layer)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = p["model.embed_tokens.weight"][inputs]
    eps = cfg["norm_eps"]
    aux = torch.zeros((), dtype=torch.float64)
    z = torch.zeros((), dtype=torch.float64)
    margins = {}
    for i in range(cfg["n_layers"]):
        pre = f"model.layers.{i}."
        x = x + attention(rms_norm(x, p[pre + "input_layernorm.weight"], eps), p, pre + "self_attn.", cfg)
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(cfg, i):
            y, layer_aux, layer_z, margins[i] = moe(h, p, pre + "mlp.", cfg)
            aux, z = aux + layer_aux, z + layer_z
        else:
            y = mlp(h, p, pre + "mlp.")
        x = x + y
    x = rms_norm(x, p["model.norm.weight"], eps)
    logits = x @ p["lm_head.weight"].T
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return ce, aux, z, margins


def check_losses(dump, ce_t, aux_t, args):
    """Prints and checks the dump's loss.ce (relative) and loss.aux (relative,
    absolute when the reference's is 0) against the reference's; True if both hold."""
    ok = True
    ce = float(dump["loss.ce"].reshape(-1)[0])
    rel = abs(ce - ce_t.item()) / abs(ce_t.item())
    status = "ok" if rel <= args.loss_rtol else "FAIL"
    ok &= status == "ok"
    print(f"{status:4} loss.ce  remat {ce:.8f}  torch {ce_t.item():.8f}  rel diff {rel:.2e} (tol {args.loss_rtol:g})")
    aux = float(dump["loss.aux"].reshape(-1)[0])
    if aux_t.item() != 0:
        diff, kind, tol = abs(aux - aux_t.item()) / abs(aux_t.item()), "rel", args.aux_rtol
    else:
        diff, kind, tol = abs(aux), "abs", args.aux_atol
    status = "ok" if diff <= tol else "FAIL"
    ok &= status == "ok"
    print(f"{status:4} loss.aux remat {aux:.8f}  torch {aux_t.item():.8f}  {kind} diff {diff:.2e} (tol {tol:g})")
    return ok


def check_gradients(dump, params, names, args):
    """Prints and checks every dump grad.NAME against the reference's gradient
    of params[NAME] (max |diff| / max |reference|; a parameter backward did not
    reach counts as zeros); True if all are within args.grad_rtol."""
    ok = True
    worst = (0.0, "")
    for k in names:
        g = params[k].grad
        if g is None:  # e.g. an expert no token chose
            g = torch.zeros_like(params[k])
        mine = dump["grad." + k].to(torch.float64)
        scale = g.abs().max().item()
        diff = (mine - g).abs().max().item() / (scale if scale > 0 else 1.0)
        if not math.isfinite(diff):
            diff = math.inf
        if diff > worst[0] or not worst[1]:
            worst = (diff, k)
        if diff > args.grad_rtol:
            ok = False
            print(f"FAIL grad.{k}  max diff / max value {diff:.2e} (tol {args.grad_rtol:g})")
    status = "ok" if worst[0] <= args.grad_rtol else "FAIL"
    print(f"{status:4} {len(names)} gradients, worst grad.{worst[1]}: {worst[0]:.2e} (tol {args.grad_rtol:g})")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="a file written by ./remat dump")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--aux-rtol", type=float, default=1e-5)
    ap.add_argument("--aux-atol", type=float, default=1e-7, help="used when the reference aux loss is 0")
    ap.add_argument("--grad-rtol", type=float, default=1e-4)
    args = ap.parse_args()

    tensors, meta = read_safetensors(args.dump)
    cfg = load_config(meta)
    why = unsupported(cfg)
    if why:
        print(f"reference: {why}", file=sys.stderr)
        return 2

    # The dump must hold exactly the parameters of the config's model.
    names = [k for k in tensors if not k.startswith(("grad.", "batch.", "loss."))]
    shapes = expected_parameters(cfg)
    bad = [f"missing parameter {k} {v}" for k, v in shapes.items() if k not in tensors]
    bad += [f"unexpected parameter {k}" for k in names if k not in shapes]
    bad += [f"parameter {k} is {list(tensors[k].shape)}, expected {shapes[k]}"
            for k in names if k in shapes and list(tensors[k].shape) != shapes[k]]
    bad += [f"missing or misshapen grad.{k}" for k in names
            if "grad." + k not in tensors or tensors["grad." + k].shape != tensors[k].shape]
    if bad:
        for b in bad:
            print(f"FAIL {b}")
        return 1

    params = {k: tensors[k].to(torch.float64).requires_grad_(True) for k in names}
    tokens = tensors["batch.tokens"].to(torch.int64)
    ce_t, aux_t, z_t, margins = forward(params, tokens, cfg)
    total = ce_t + cfg["aux_coef"] * aux_t
    if cfg["z_coef"] != 0:
        total = total + cfg["z_coef"] * z_t
    total.backward()

    ok = check_losses(tensors, ce_t, aux_t, args)
    if margins:
        # Not checked (the dump has no z-loss or routing); shown to help read failures.
        layer = min(margins, key=margins.get)
        routing = (f"smallest top-{cfg['top_k']} routing margin {margins[layer]:.2e} (layer {layer})"
                   if math.isfinite(margins[layer]) else "every expert selected")
        print(f"info {len(margins)} MoE layers, z-loss sum {z_t.item():.6f} (coef {cfg['z_coef']:g}); {routing}")

    ok &= check_gradients(tensors, params, names, args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
