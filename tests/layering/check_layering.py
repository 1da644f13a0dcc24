#!/usr/bin/env python3
"""Checks the one-way layering of the source tree from its include lines.

Every top-level folder is a layer; a file may include headers of its own
folder and of folders in lower layers only:

    engine < ops < cuda < checkpoint, parallel < moe < models < train, tokenizer
           < tools < api, python < examples

checkpoint and parallel share a layer and may not include each other, and
so do train and tokenizer, and api and python (the Python module);
tests/ may include anything and is not checked. Every `#include "..."` (and
`#include <remat/...>`, the installed API) of every .h .cc .cu .cuh .cpp
file under a layer folder is read. An include that points up (or sideways)
the order, or names a header whose opening comment says "Internal to
FOLDER/" from outside FOLDER, is reported as FILE:LINE with the included
path and both layers, and the check exits 1. Includes of anything outside
the layer folders (system and third-party headers) are not checked.

Usage: check_layering.py [--root DIR] [--folders]
  --root DIR   the tree to check (default: this repository)
  --folders    print the layer folders, lowest first, and exit
"""
import argparse
import os
import re
import sys

LAYERS = [
    ["engine"],
    # ops/ defines every op and its CPU kernels; cuda/ registers its kernels
    # for them (ops/kernel_table.h), so no op file includes a cuda/ header.
    ["ops"],
    ["cuda"],
    ["checkpoint", "parallel"],
    ["moe"],
    ["models"],
    ["train", "tokenizer"],
    ["tools"],
    ["api", "python"],
    ["examples"],
]
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}
SOURCE_EXTS = (".h", ".cc", ".cu", ".cuh", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(remat/[^>]+)>)')
INTERNAL = re.compile(r"\bInternal to (\w+)/")

# Violations that remain while other work removes them, as (including file,
# included path), each with the reason it is still here. The goal is an
# empty list: delete an entry together with the include it names. An entry
# whose include no longer occurs is reported as a note (not a failure).
ALLOWED = {
    # bench-ops and bench's peak FLOP/s time the CPU GEMM itself, which
    # ops/gemm.h calls internal to ops/: either the header becomes public
    # or the benchmarks go through matmul.
    ("tools/bench_flops.cc", "ops/gemm.h"),
    ("tools/bench_ops.cc", "ops/gemm.h"),
}


def resolve(path, including_file, root):
    """The tree-relative path an include names, or None outside the layer folders."""
    if path.startswith("remat/"):
        return "api/" + path[len("remat/"):]  # the installed headers (include_prefix "remat")
    if path.split("/", 1)[0] in RANK and "/" in path:
        return path
    # Relative to the including file's own folder.
    here = os.path.dirname(including_file)
    if os.path.exists(os.path.join(root, here, path)):
        resolved = os.path.normpath(os.path.join(here, path))
        if resolved.split(os.sep, 1)[0] in RANK:
            return resolved.replace(os.sep, "/")
    return None


def source_files(root):
    for folder in sorted(RANK):
        base = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXTS):
                    yield os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")


def internal_owner(root, header, cache):
    """The folder a header's opening comment keeps it internal to, or None."""
    if header not in cache:
        cache[header] = None
        try:
            with open(os.path.join(root, header), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.startswith("//"):
                        break
                    m = INTERNAL.search(line)
                    if m:
                        cache[header] = m.group(1)
                        break
        except OSError:
            pass
    return cache[header]


def layer_desc(folder):
    return f"{folder} (layer {RANK[folder]})"


def check(root):
    """Returns (violation messages, stale allowlist entries)."""
    violations, used, internal_cache = [], set(), {}
    for rel in source_files(root):
        owner = rel.split("/", 1)[0]
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1) or m.group(2)
                target_path = resolve(inc, rel, root)
                if target_path is None:
                    continue
                target = target_path.split("/", 1)[0]
                problem = None
                if target != owner and RANK[target] >= RANK[owner]:
                    how = "the same layer as" if RANK[target] == RANK[owner] else "a layer above"
                    problem = f"{layer_desc(owner)} may not include {layer_desc(target)}, {how} it"
                elif target != owner:
                    keeper = internal_owner(root, target_path, internal_cache)
                    if keeper is not None and keeper != owner:
                        problem = (f"{layer_desc(owner)} may not include a header internal to "
                                   f"{keeper}/ (its opening comment says so)")
                if problem is None:
                    continue
                if (rel, inc) in ALLOWED:
                    used.add((rel, inc))
                    continue
                violations.append(f'{rel}:{lineno}: #include "{inc}": {problem}')
    return violations, sorted(set(ALLOWED) - used)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--folders", action="store_true")
    args = ap.parse_args()
    if args.folders:
        print(" ".join(f for fs in LAYERS for f in fs))
        return 0
    violations, stale = check(os.path.abspath(args.root))
    for f, inc in stale:
        print(f'note: the allowlisted include of "{inc}" in {f} no longer occurs; '
              f"remove it from ALLOWED in tests/layering/check_layering.py")
    for v in violations:
        print(v)
    order = " < ".join(", ".join(fs) for fs in LAYERS)
    if violations:
        print(f"layering: {len(violations)} include(s) break the layer order ({order}) or reach into another "
              "folder's internal header")
        return 1
    print(f"layering: ok ({len(ALLOWED) - len(stale)} allowlisted include(s) remain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
