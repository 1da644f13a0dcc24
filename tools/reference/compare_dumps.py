#!/usr/bin/python3
"""Compares two `./remat dump` files tensor by tensor, bit for bit.

Exit status 0 when both files hold the same tensor names with identical
dtypes, shapes and bytes (metadata is ignored); otherwise prints each
difference (and the largest absolute difference of float tensors) and exits 1.
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
    a, b = read(sys.argv[1]), read(sys.argv[2])
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"only in one file: {name}")
            bad += 1
            continue
        if a[name] != b[name]:
            bad += 1
            msg = f"differs: {name}"
            if a[name][0] == "F32" and a[name][1] == b[name][1]:
                fa = struct.unpack(f"<{len(a[name][2]) // 4}f", a[name][2])
                fb = struct.unpack(f"<{len(b[name][2]) // 4}f", b[name][2])
                msg += f" (max abs diff {max(abs(x - y) for x, y in zip(fa, fb)):.3e})"
            print(msg)
    print(f"{len(a)} tensors compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
