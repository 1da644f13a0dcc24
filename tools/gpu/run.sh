#!/usr/bin/env bash
# The GPU check, run on the GPU machine from the bundle tools/gpu/build.sh
# made: unpacks the bundled libraries, finds the CUDA libraries (the toolkit,
# or the nvidia/*/lib folders of Python packages), runs every CUDA test
# binary, then `remat bench --device cuda` on the bench configs and a larger
# dense one (once the build has CUDA ops), writing everything under
# OUTDIR (summary.txt first). Without a GPU it says so and exits 2.
#
#   run.sh OUTDIR [--quick]
set -uo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
outdir=${1:?usage: run.sh OUTDIR [--quick]}
quick=${2:-}
mkdir -p "$outdir"
summary="$outdir/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)

lib=$(mktemp -d)
trap 'rm -rf "$lib"' EXIT
tar -C "$lib" -xJf "$here/libs.tar.xz"
paths="$lib/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
         /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && paths="$paths:$d"
done
for py in $(ls -d /usr/lib/python3*/site-packages /usr/local/lib/python3*/site-packages \
               /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages 2>/dev/null); do
  for d in "$py"/nvidia/*/lib; do [ -d "$d" ] && paths="$paths:$d"; done
done
export LD_LIBRARY_PATH="$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for l in libcudart.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  found=$(for p in ${paths//:/ }; do [ -e "$p/$l" ] && echo "$p/$l" && break; done)
  say "library $l: ${found:-NOT FOUND}"
done

devices=$("$here/bin/remat" info 2>&1 | tee "$outdir/info.txt" | grep -E "CUDA devices *: *[1-9]" || true)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1 || [ -z "$devices" ]; then
  say "no GPU: nvidia-smi finds no device or remat sees no CUDA device (see info.txt); nothing to check here"
  exit 2
fi
nvidia-smi > "$outdir/nvidia-smi.txt" 2>&1
say "GPU: $(nvidia-smi -L | head -1)"

failed=0
for t in "$here"/bin/*_test; do
  name=$(basename "$t")
  timeout 300 "$t" "[cuda]" > "$outdir/$name.txt" 2>&1
  rc=$?
  say "$name: $(grep 'remat-tests:' "$outdir/$name.txt" | tail -1) (rc $rc)"
  [ $rc -eq 0 ] || failed=$((failed + 1))
done

if [ "$quick" != "--quick" ]; then
  if "$here/bin/remat" bench --help 2>&1 | grep -q -- "--device"; then
    # The bench configs and the larger dense one of #9 (d 1024, 16 layers, seq 1024, batch 8), in bf16.
    printf '{"name": "gpu-dense", "vocab": 32000, "d_model": 1024, "n_layers": 16, "n_heads": 16, "ffn": 2816, "seq": 1024, "batch": 8}' \
      > "$outdir/gpu-dense.json"
    for cfg in bench-dense bench-moe "$outdir/gpu-dense.json"; do
      name=$(basename "$cfg" .json)
      timeout 240 "$here/bin/remat" bench --device cuda --dtype bf16 --config "$cfg" --recompute none,per_block \
        --repeats 2 --warmup 1 --steps 3 --json "$outdir/bench-$name.json" > "$outdir/bench-$name.txt" 2>&1
      say "bench $name: rc $? ($(tail -n 3 "$outdir/bench-$name.txt" | head -1))"
    done
  else
    say "bench on CUDA: this build's bench has no --device (the ops have no CUDA kernels yet, #9); skipped"
  fi
fi
say "done in $(( $(date +%s) - start )) s, $failed test binaries failed"
[ $failed -eq 0 ]
