#!/usr/bin/python3
"""Summarises a GPU check's bench JSON: MFU and tokens/s per plan, the ratio
to PyTorch eager on the same model, activations / step time of every plan
against none, and the time offload waited per step. Usage: summarize.py OUTDIR"""
import glob
import json
import os
import sys


def main():
    out = sys.argv[1]
    for path in sorted(glob.glob(os.path.join(out, "bench-*.json"))):
        name = os.path.basename(path)[len("bench-"):-len(".json")]
        try:
            doc = json.load(open(path))
            # bench --json writes {"rows": [...], "runs": [...], "torch": {...}}; older files were the rows alone.
            rows = {r["plan"]: r for r in (doc["rows"] if isinstance(doc, dict) else doc)}
        except (OSError, ValueError, KeyError) as e:
            print(f"{name}: no results ({e})")
            continue
        torch_tps = doc["torch"]["tokens_per_s"] if isinstance(doc, dict) and "torch" in doc else None
        tp = os.path.join(out, f"torch-{name}.json")
        if torch_tps is None and os.path.exists(tp):
            try:
                torch_tps = json.loads(open(tp).read().strip().splitlines()[-1])["tokens_per_s"]
            except (ValueError, IndexError, KeyError):
                pass
        for plan, r in rows.items():
            line = (f"{name} {plan}: {r['tokens_per_s']:.0f} tok/s, step {r['step_ms']:.1f} ms, "
                    f"MFU {100 * r['mfu']:.1f}%, activations {r['activation_bytes'] / 2**20:.0f} MiB, "
                    f"peak {r['peak_allocated_bytes'] / 2**20:.0f} MiB")
            if r.get("offload_ms"):
                line += f", offload waited {r['offload_ms']:.2f} ms/step ({r.get('offloaded_bytes', 0) / 2**20:.0f} MiB moved)"
            if torch_tps:
                line += f", {r['tokens_per_s'] / torch_tps:.2f}x PyTorch eager ({torch_tps:.0f} tok/s)"
            print(line)
        n = rows.get("none")
        for plan, p in rows.items():
            if n is None or plan == "none":
                continue
            print(f"{name} {plan} vs none: activations x{p['activation_bytes'] / max(n['activation_bytes'], 1):.2f}, "
                  f"step time x{p['step_ms'] / n['step_ms']:.2f}")


if __name__ == "__main__":
    main()
