#!/usr/bin/python3
"""PyTorch eager baseline for remat's step time on the same model.

Builds the decoder of DESIGN.md §7 for a named config (same shapes, f32, CPU),
runs warm-up steps, then times forward + backward + AdamW steps on random
byte batches and prints the median step time and tokens/s as JSON.
"""

import argparse
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
        self.input_layernorm = RMSNorm(d)
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, c["ffn"], bias=False)
        self.up_proj = nn.Linear(d, c["ffn"], bias=False)
        self.down_proj = nn.Linear(c["ffn"], d, bias=False)
        self.mask = torch.triu(torch.ones(c["seq"], c["seq"], dtype=torch.bool), diagonal=1)

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
        self.norm = RMSNorm(c["d"])
        self.lm_head = nn.Linear(c["d"], c["vocab"], bias=False)
        dh = c["d"] // c["heads"]
        inv = 10000.0 ** (-torch.arange(0, dh // 2, dtype=torch.float64) * 2 / dh)
        ang = torch.outer(torch.arange(c["seq"], dtype=torch.float64), inv)
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).float()
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).float()

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="bench-dense", choices=sorted(CONFIGS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = CONFIGS[args.config]
    model = Model(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for i in range(args.warmup + args.steps):
        tokens = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1000)
    med = statistics.median(times)
    print(json.dumps({"config": args.config, "framework": f"pytorch {torch.__version__} eager", "threads": args.threads,
                      "step_ms": med, "step_ms_min": min(times), "step_ms_max": max(times),
                      "tokens_per_s": c["batch"] * c["seq"] / (med / 1000)}))


if __name__ == "__main__":
    main()
