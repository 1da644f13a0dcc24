#!/usr/bin/python3
"""Compares two `./remat dump` files tensor by tensor, bit for bit, or with
--rtol R to a tolerance: an F32 tensor matches when max |a - b| <= R * max |b|
(relative to the tensor's own scale, as a sum over a batch is accurate to).

Exit status 0 when both files hold the same tensor names with identical
dtypes, shapes and bytes (or F32 values within the tolerance; metadata is
ignored); otherwise prints each difference (and the largest absolute
difference of float tensors) and exits 1.

    compare_dumps.py A.safetensors B.safetensors [--rtol R]
"""

import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0] : base + v["data_offsets"][1]]) for k, v in header.items()}


def main():
    args = sys.argv[1:]
    rtol = None
    if "--rtol" in args:
        i = args.index("--rtol")
        rtol = float(args[i + 1])
        del args[i : i + 2]
    a, b = read(args[0]), read(args[1])
    bad = 0
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
    print(f"{len(a)} tensors compared, {bad} differ{tol}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
