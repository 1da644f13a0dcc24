#!/usr/bin/python3
"""Compares two `./remat dump` files tensor by tensor, bit for bit, or with
--rtol R to a tolerance: an F32 tensor matches when max |a - b| <= R * max |b|
(relative to the tensor's own scale, as a sum over a batch is accurate to).

Exit status 0 when both files hold the same tensor names with identical
dtypes, shapes and bytes (or F32 values within the tolerance); otherwise
prints each difference (and the largest absolute difference of float
tensors) and exits 1.

With --plan SPEC the comparison is a plan's against `none`, and the
metadata must show that both plans ran (docs/REFERENCE.md, dump): A ran
`none` (recompute and recompute_plan "none", every effect 0); B was asked
for SPEC (recompute) and its model ran CANONICAL (recompute_plan; --ran,
default SPEC), and B's effects are non-zero exactly as CANONICAL implies:
recomputed_ops with a region (any component but offload, compress and
selective:moe_act, whose activation is made again inside its consumer's
backward, not replayed), offloaded_bytes with offload, compressed_saved_bytes with compress, and on
an MoE config replayed_dispatch_bytes with a region around the router
(per_block, chunk, reentrant or not, selective:moe, selective:mlp, or a
selective:save_* block region) on a block range that holds an MoE block. chunked_loss is
no region (its op makes the head's gradients with its logits).

With --dynamic, B's plan holds `dynamic` (checkpoint/dynamic_remat.h): its
metadata must show the budget bound (evictions and rebuilds > 0) and held
(peak_allocated_bytes <= memory_budget_bytes). `dynamic` is no region.

    compare_dumps.py A.safetensors B.safetensors [--rtol R] [--plan SPEC [--ran CANONICAL]] [--dynamic]
"""

import json
import struct
import sys


EFFECTS = ("recomputed_ops", "offloaded_bytes", "compressed_saved_bytes", "replayed_dispatch_bytes")
# Components whose regions replay the routed experts' dispatch and combine:
# whole blocks, and the module regions around the router (moe_expert starts
# after the dispatch and does not move rows again).
DISPATCH_REGIONS = ("per_block", "chunk")
DISPATCH_MODULES = ("moe", "mlp")


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0] : base + v["data_offsets"][1]]) for k, v in header.items()}
    return tensors, meta


def moe_layers(config):
    """The indices of the config's MoE blocks (models/config.h is_moe_layer)."""
    if config.get("experts", 0) <= 0:
        return set()
    first, step = config.get("dense_first", 0), config.get("sparse_step", 1) or 1
    dense = set(config.get("dense_layers", []))
    return {i for i in range(config.get("n_layers", 0))
            if i >= first and (step <= 1 or (i + 1) % step == 0) and i not in dense}


def blocks_of(component, n_layers):
    """The blocks a canonical component applies to: its @A-B, else all."""
    _, _, r = component.partition("@")
    if not r:
        return set(range(n_layers))
    lo, _, hi = r.partition("-")
    return set(range(int(lo), int(hi or lo) + 1))


def expected_effects(canonical, config):
    """Which effects CANONICAL (a plan's canonical string) makes non-zero on CONFIG (the dump's)."""
    comps = canonical.split("+") if canonical != "none" else []
    names = [c.split("@")[0] for c in comps]
    kinds = [n.split(":")[0] for n in names]
    # selective:moe_act is no replay: the expert activation is dropped and made
    # again inside its consumer's backward (no counter shows it; the recorded
    # plan does). chunked_loss is no region either: its op makes the head's
    # gradients with its logits.
    regions = [c for c, n, k in zip(comps, names, kinds)
               if k not in ("offload", "compress", "chunked_loss", "dynamic") and n != "selective:moe_act"]
    moe = moe_layers(config)

    def replays_dispatch(c):
        kind, _, arg = c.split("@")[0].partition(":")
        around_router = kind in DISPATCH_REGIONS or (kind == "selective" and (arg in DISPATCH_MODULES or arg.startswith("save_")))
        return around_router and bool(blocks_of(c, config.get("n_layers", 0)) & moe)

    return {"recomputed_ops": bool(regions), "offloaded_bytes": "offload" in kinds,
            "compressed_saved_bytes": "compress" in kinds,
            "replayed_dispatch_bytes": any(replays_dispatch(c) for c in regions)}


def check_plan(meta, label, spec, canonical):
    """Problems with what META says ran, against SPEC asked for and CANONICAL run."""
    problems = []
    for key in ("recompute", "recompute_plan") + EFFECTS:
        if key not in meta:
            problems.append(f"{label}: metadata has no '{key}'")
    if problems:
        return problems
    if meta["recompute"] != spec:
        problems.append(f"{label}: asked for --recompute '{meta['recompute']}', expected '{spec}'")
    if meta["recompute_plan"] != canonical:
        problems.append(f"{label}: the model ran plan '{meta['recompute_plan']}', expected '{canonical}'")
    config = json.loads(meta.get("config", "{}"))
    for key, nonzero in expected_effects(canonical, config).items():
        value = int(meta[key])
        if value < 0 or (value > 0) != nonzero:
            problems.append(f"{label}: {key} {value}, expected {'> 0' if nonzero else '0'} for plan '{canonical}'")
    return problems


def check_dynamic(meta):
    """Problems with B's dynamic metadata: the budget must have bound and held."""
    keys = ("recompute_plan", "memory_budget_bytes", "peak_allocated_bytes", "evictions", "rebuilds")
    missing = [k for k in keys if k not in meta]
    if missing:
        return [f"B: metadata has no {', '.join(missing)}"]
    problems = []
    if "dynamic" not in meta["recompute_plan"]:
        problems.append(f"B: ran plan '{meta['recompute_plan']}', which has no dynamic")
    if int(meta["evictions"]) <= 0 or int(meta["rebuilds"]) <= 0:
        problems.append(f"B: {meta['evictions']} evictions, {meta['rebuilds']} rebuilds: the budget did not bind")
    if int(meta["peak_allocated_bytes"]) > int(meta["memory_budget_bytes"]):
        problems.append(f"B: peak {meta['peak_allocated_bytes']} above the budget {meta['memory_budget_bytes']}")
    return problems


def take(args, flag):
    if flag not in args:
        return None
    i = args.index(flag)
    value = args[i + 1]
    del args[i : i + 2]
    return value


def main():
    args = sys.argv[1:]
    rtol = take(args, "--rtol")
    rtol = float(rtol) if rtol is not None else None
    spec = take(args, "--plan")
    canonical = take(args, "--ran") or spec
    dynamic = "--dynamic" in args
    if dynamic:
        args.remove("--dynamic")
    (a, meta_a), (b, meta_b) = read(args[0]), read(args[1])
    bad = 0
    problems = []
    if spec is not None:
        problems = check_plan(meta_a, "A", "none", "none") + check_plan(meta_b, "B", spec, canonical)
    if dynamic:
        problems += check_dynamic(meta_b)
    for p in problems:
        print(f"plan: {p}")
    worst = 0.0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"only in one file: {name}")
            bad += 1
            continue
        if a[name] != b[name]:
            floats = a[name][0] == "F32" and a[name][:2] == b[name][:2]
            diff = scale = 0.0
            if floats:
                fa = struct.unpack(f"<{len(a[name][2]) // 4}f", a[name][2])
                fb = struct.unpack(f"<{len(b[name][2]) // 4}f", b[name][2])
                diff = max((abs(x - y) for x, y in zip(fa, fb)), default=0.0)
                scale = max((abs(y) for y in fb), default=0.0)
                worst = max(worst, diff / scale if scale > 0 else diff)
            if rtol is not None and floats and diff <= rtol * scale:
                continue
            bad += 1
            msg = f"differs: {name}"
            if floats:
                msg += f" (max abs diff {diff:.3e}, tensor scale {scale:.3e})"
            print(msg)
    tol = f" (rtol {rtol:g}; worst relative difference {worst:.2e})" if rtol is not None else ""
    ran = ""
    if problems:
        ran = f"; {len(problems)} plan problems"
    elif spec is not None:
        ran = f"; B ran '{canonical}', its effects as the plan implies"
    if dynamic and not problems:
        ran += (f"; {meta_b['recompute_plan']}: peak {meta_b['peak_allocated_bytes']} <= budget, "
                f"{meta_b['evictions']} evictions, {meta_b['rebuilds']} rebuilds")
    print(f"{len(a)} tensors compared, {bad} differ{tol}{ran}")
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
