#!/usr/bin/python3
"""PyTorch eager baseline for remat's step time on the same model.

Builds the decoder of docs/REFERENCE.md#models-and-configs for a named config or
a remat config JSON file (same shapes), on the CPU (f32) or a CUDA device (f32,
or bf16 autocast with f32 master weights, the usual PyTorch mixed precision),
runs warm-up steps, then times forward + backward + AdamW steps on random token
batches and prints the median step, forward and backward times and tokens/s as
one JSON line. `./remat bench --baseline torch` runs it as one variant of its
interleaved order.
"""

import argparse
import contextlib
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    "tiny": dict(vocab=256, d=128, layers=4, heads=4, ffn=344, seq=128, batch=8),
    "bench-dense": dict(vocab=256, d=512, layers=8, heads=8, ffn=1376, seq=256, batch=4),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, cos, sin):
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h = c["d"], c["heads"]
        self.input_layernorm = RMSNorm(d, c.get("eps", 1e-5))
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c.get("eps", 1e-5))
        self.gate_proj = nn.Linear(d, c["ffn"], bias=False)
        self.up_proj = nn.Linear(d, c["ffn"], bias=False)
        self.down_proj = nn.Linear(c["ffn"], d, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(c["seq"], c["seq"], dtype=torch.bool), diagonal=1),
                             persistent=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(b, s, self.h, d // self.h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0: fused kernel
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x (Debian bookworm ships 1.13): the eager composite
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(self.mask[:s, :s], float("-inf"))
            o = torch.softmax(scores, -1) @ v
        x = x + self.o_proj(o.transpose(1, 2).reshape(b, s, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c["vocab"], c["d"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["d"], c.get("eps", 1e-5))
        self.lm_head = nn.Linear(c["d"], c["vocab"], bias=False)
        dh = c["d"] // c["heads"]
        inv = c.get("rope_theta", 10000.0) ** (-torch.arange(0, dh // 2, dtype=torch.float64) * 2 / dh)
        ang = torch.outer(torch.arange(c["seq"], dtype=torch.float64), inv)
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1).float(), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1).float(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x)).float()  # the loss in f32, as remat computes it
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def load_config(name):
    """A named config, or a remat config JSON file (vocab, d_model, n_layers, n_heads, ffn, seq, batch; rope_theta
    and norm_eps when present). Refuses what this dense baseline does not model (experts, dropout)."""
    if name in CONFIGS:
        return dict(CONFIGS[name])
    with open(name) as f:
        j = json.load(f)
    if j.get("experts", 0) or j.get("dropout", 0):
        raise SystemExit(f"bench_torch.py: config {name} has experts={j.get('experts', 0)} dropout={j.get('dropout', 0)}; "
                         "this baseline models the dense decoder without dropout only")
    return dict(vocab=j["vocab"], d=j["d_model"], layers=j["n_layers"], heads=j["n_heads"], ffn=j["ffn"],
                seq=j["seq"], batch=j["batch"], rope_theta=j.get("rope_theta", 10000.0), eps=j.get("norm_eps", 1e-5))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="bench-dense", help="%s or a remat config FILE.json" % ", ".join(sorted(CONFIGS)))
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="bf16: autocast, f32 master weights")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = load_config(args.config)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    model = Model(c).to(dev)
    # The fused CUDA AdamW when there is one (PyTorch >= 2.0), as a tuned PyTorch run would use.
    extra = {"fused": True} if cuda and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, **extra)
    # bf16 autocast on CUDA only (a CPU-only PyTorch refuses to construct a CUDA autocast, even disabled).
    use_autocast = cuda and args.dtype == "bf16"
    autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if use_autocast else contextlib.nullcontext()
    times, fwd, bwd = [], [], []
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(args.warmup + args.steps):
        tokens = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), device=dev)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(tokens)
        loss.item()  # the forward is complete
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1000)
            fwd.append((t1 - t0) * 1000)
            bwd.append((t2 - t1) * 1000)
    med = statistics.median(times)
    print(json.dumps({"config": args.config, "framework": f"pytorch {torch.__version__} eager", "threads": args.threads,
                      "device": args.device, "dtype": args.dtype, "step_ms": med, "step_ms_min": min(times),
                      "step_ms_max": max(times), "forward_ms": statistics.median(fwd),
                      "backward_ms": statistics.median(bwd), "tokens_per_s": c["batch"] * c["seq"] / (med / 1000),
                      "tokens": c["batch"] * c["seq"],
                      "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else 0}))


if __name__ == "__main__":
    main()
