#!/usr/bin/python3
"""Independent PyTorch reference for `./remat dump` files.

Reads a dump (safetensors: parameters under Hugging Face Llama names,
batch.tokens, loss.ce, loss.aux, grad.<name>), rebuilds the same decoder in
PyTorch (float64 on the CPU), computes the loss and every parameter gradient,
and reports the largest differences:

  loss.ce   relative difference |remat - torch| / |torch|
  grad.X    max |remat - torch| / max |torch|

Exit status 0 when every difference is within the tolerances (--loss-rtol,
--grad-rtol), 1 otherwise. Uses Debian's python3-torch; no network.
"""

import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_}


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
    g = x @ p[prefix + "gate_proj.weight"].T
    u = x @ p[prefix + "up_proj.weight"].T
    return (torch.nn.functional.silu(g) * u) @ p[prefix + "down_proj.weight"].T


def forward(p, tokens, cfg):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = p["model.embed_tokens.weight"][inputs]
    eps = cfg["norm_eps"]
    for i in range(cfg["n_layers"]):
        pre = f"model.layers.{i}."
        x = x + attention(rms_norm(x, p[pre + "input_layernorm.weight"], eps), p, pre + "self_attn.", cfg)
        x = x + mlp(rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps), p, pre + "mlp.")
    x = rms_norm(x, p["model.norm.weight"], eps)
    logits = x @ p["lm_head.weight"].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="a file written by ./remat dump")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--grad-rtol", type=float, default=1e-4)
    args = ap.parse_args()

    tensors, meta = read_safetensors(args.dump)
    cfg = json.loads(meta["config"])
    if cfg.get("experts", 0) > 0:
        print("reference: MoE configs are not supported by this reference yet", file=sys.stderr)
        return 2
    names = [k for k in tensors if not k.startswith(("grad.", "batch.", "loss."))]
    params = {k: tensors[k].to(torch.float64).requires_grad_(True) for k in names}
    tokens = tensors["batch.tokens"].to(torch.int64)
    loss = forward(params, tokens, cfg)
    loss.backward()

    ok = True
    ce = float(tensors["loss.ce"].reshape(-1)[0])
    rel = abs(ce - loss.item()) / abs(loss.item())
    status = "ok" if rel <= args.loss_rtol else "FAIL"
    ok &= status == "ok"
    print(f"{status:4} loss.ce  remat {ce:.8f}  torch {loss.item():.8f}  rel diff {rel:.2e} (tol {args.loss_rtol:g})")
    worst = (0.0, "")
    for k in names:
        g = params[k].grad
        mine = tensors["grad." + k].to(torch.float64)
        scale = g.abs().max().item()
        diff = (mine - g).abs().max().item() / (scale if scale > 0 else 1.0)
        if diff > worst[0]:
            worst = (diff, k)
        if diff > args.grad_rtol:
            ok = False
            print(f"FAIL grad.{k}  max diff / max value {diff:.2e} (tol {args.grad_rtol:g})")
    print(f"{'ok' if worst[0] <= args.grad_rtol else 'FAIL':4} {len(names)} gradients, worst grad.{worst[1]}: {worst[0]:.2e} (tol {args.grad_rtol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
