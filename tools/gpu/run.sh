#!/usr/bin/env bash
# The GPU check, run on the GPU machine from the bundle tools/gpu/build.sh
# made: unpacks the bundled libraries, finds the CUDA libraries (the toolkit,
# or the nvidia/*/lib folders of Python packages), runs every CUDA test
# binary, then `remat bench --device cuda` (bf16) on the bench configs and a
# larger dense one, with PyTorch eager on the same dense models as the
# baseline, and summarises MFU, tokens/s against PyTorch and activations /
# step time for none vs per_block, writing everything under OUTDIR
# (summary.txt first). Without a GPU it says so and exits 2.
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
# Everything finishes within 8 minutes: each step's timeout is capped by
# what is left of that budget (REMAT_GPU_BUDGET seconds overrides it).
budget=${REMAT_GPU_BUDGET:-470}
cap() {  # cap N: N, or the seconds left of the budget if fewer (at least 1)
  local left=$(( start + budget - $(date +%s) ))
  [ $left -lt 1 ] && left=1
  [ "$1" -lt $left ] && echo "$1" || echo $left
}

unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
tar -C "$unpacked" -xJf "$here/bundle.tar.xz"
bin="$unpacked/bin"
paths="$unpacked/lib"
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

devices=$("$bin/remat" info 2>&1 | tee "$outdir/info.txt" | grep -E "CUDA devices *: *[1-9]" || true)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1 || [ -z "$devices" ]; then
  say "no GPU: nvidia-smi finds no device or remat sees no CUDA device (see info.txt); nothing to check here"
  exit 2
fi
nvidia-smi > "$outdir/nvidia-smi.txt" 2>&1
say "GPU: $(nvidia-smi -L | head -1)"

failed=0
for t in "$bin"/*_test; do
  name=$(basename "$t")
  timeout "$(cap 150)" "$t" "[cuda]" > "$outdir/$name.txt" 2>&1
  rc=$?
  say "$name: $(grep 'remat-tests:' "$outdir/$name.txt" | tail -1) (rc $rc)"
  [ $rc -eq 0 ] || failed=$((failed + 1))
done

# `tiny` dumps (loss and every gradient after one step) on CUDA f32 against the CPU's.
for cfg in tiny tiny-moe; do
  timeout "$(cap 60)" "$bin/remat" dump --config $cfg --out "$outdir/dump-$cfg-cpu.safetensors" > "$outdir/dump-$cfg.txt" 2>&1
  timeout "$(cap 60)" "$bin/remat" dump --config $cfg --device cuda --out "$outdir/dump-$cfg-cuda.safetensors" >> "$outdir/dump-$cfg.txt" 2>&1
  python3 "$here/compare_dumps.py" "$outdir/dump-$cfg-cuda.safetensors" "$outdir/dump-$cfg-cpu.safetensors" --rtol 1e-5 \
    >> "$outdir/dump-$cfg.txt" 2>&1
  rc=$?
  say "dump $cfg cuda vs cpu: $(tail -n 1 "$outdir/dump-$cfg.txt") (rc $rc)"
  [ $rc -eq 0 ] || failed=$((failed + 1))
done
rm -f "$outdir"/dump-*.safetensors

if [ "$quick" != "--quick" ]; then
  # Training on the GPU lowers the loss (bf16, 100 steps of tiny).
  timeout "$(cap 60)" "$bin/remat" train --config tiny --device cuda --dtype bf16 --steps 100 --eval-every 50 \
    > "$outdir/train-tiny.txt" 2>&1
  say "train tiny on cuda bf16: rc $? ($(grep -E '^done' "$outdir/train-tiny.txt" | cut -c1-120))"
  # The bench configs and the larger dense one of #9 (d 1024, 16 layers, seq 1024, batch 8), in bf16,
  # each next to PyTorch eager on the same model where the baseline has it (dense configs).
  printf '{"name": "gpu-dense", "vocab": 32000, "d_model": 1024, "n_layers": 16, "n_heads": 16, "ffn": 2816, "seq": 1024, "batch": 8}' \
    > "$outdir/gpu-dense.json"
  torch_ok=0
  python3 -c "import torch; assert torch.cuda.is_available()" > "$outdir/torch-check.txt" 2>&1 && torch_ok=1
  for cfg in "$outdir/gpu-dense.json" bench-dense bench-moe; do
    name=$(basename "$cfg" .json)
    timeout "$(cap 150)" "$bin/remat" bench --device cuda --dtype bf16 --config "$cfg" --recompute none,per_block \
      --repeats 2 --warmup 1 --steps 3 --json "$outdir/bench-$name.json" > "$outdir/bench-$name.txt" 2>&1
    say "bench $name: rc $?"
    if [ $torch_ok = 1 ] && [ "$name" != bench-moe ]; then
      timeout "$(cap 90)" python3 "$here/bench_torch.py" --config "$cfg" --device cuda --dtype bf16 --warmup 2 --steps 5 \
        > "$outdir/torch-$name.json" 2> "$outdir/torch-$name.err"
      say "pytorch $name: rc $?"
    fi
  done
  [ $torch_ok = 1 ] || say "pytorch: not usable here (see torch-check.txt); no baseline"
  python3 "$here/summarize.py" "$outdir" 2>&1 | tee -a "$summary" || say "summary: python3 failed"
fi
say "done in $(( $(date +%s) - start )) s, $failed test binaries failed"
[ $failed -eq 0 ]
