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
# The CUDA libraries of python3's own packages (nvidia-cublas, nvidia-nccl, ...: a
# venv's site-packages too), then the system's.
for py in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
          $(ls -d /usr/lib/python3*/site-packages /usr/local/lib/python3*/site-packages \
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
  timeout "$(cap 60)" "$t" "[cuda]" > "$outdir/$name.txt" 2>&1
  rc=$?
  say "$name: $(grep 'remat-tests:' "$outdir/$name.txt" | tail -1) (rc $rc)"
  [ $rc -eq 0 ] && continue
  failed=$((failed + 1))
  # A CUDA error is sticky: after one, every later case of the binary fails
  # too. Run each case alone, launches synchronous, to name the ones that fail.
  "$t" "[cuda]" --list-test-names-only 2>/dev/null | while IFS= read -r tc; do
    [ -n "$tc" ] || continue
    CUDA_LAUNCH_BLOCKING=1 timeout "$(cap 20)" "$t" "$tc" > "$outdir/$name.case.txt" 2>&1
    crc=$?
    say "  case '$tc': rc $crc"
    [ $crc -eq 0 ] || { echo "=== $tc (rc $crc)"; tail -n 40 "$outdir/$name.case.txt"; } >> "$outdir/$name.failed.txt"
  done
  rm -f "$outdir/$name.case.txt"
done

# The meta device mirroring CUDA's kernels against the GPU: the same step's
# peak allocated and reserved bytes (the step after the model, the optimizer
# and one step before it). bench-dense under none and per_block, f32 and
# bf16, must be equal; offload (the spill's path differs) and MoE (meta's
# routes are balanced, the GPU's are the router's) are shown for comparison.
for run in "bench-dense f32 none" "bench-dense f32 per_block" "bench-dense bf16 none" "bench-dense bf16 per_block" \
           "bench-dense bf16 offload" "bench-moe bf16 none"; do
  read -r cfg dtype plan <<< "$run"
  tag="$cfg-$dtype-$plan"
  for dev in meta cuda; do
    extra=(); [ $dev = meta ] && extra=(--meta-kernels cuda)
    timeout "$(cap 60)" "$bin/remat" mem --device $dev "${extra[@]}" --config $cfg --dtype $dtype \
      --recompute $plan --out "$outdir/mem-$dev-$tag" > "$outdir/mem-$dev-$tag.txt" 2>&1
  done
  say "mem $cfg $dtype $plan meta (CUDA's kernels) vs cuda: $(python3 - "$outdir/mem-meta-$tag.json" "$outdir/mem-cuda-$tag.json" <<'PY'
import json, sys
try:
    m, c = (json.load(open(p))["peak"] for p in sys.argv[1:3])
    a = "equal" if m["allocated"] == c["allocated"] else "DIFFER"
    r = "equal" if m["reserved_peak"] == c["reserved_peak"] else "DIFFER"
    print(f"allocated {m['allocated']} vs {c['allocated']} ({a}), reserved {m['reserved_peak']} vs {c['reserved_peak']} ({r})")
except Exception as e:
    print(f"no comparison ({e})")
PY
)"
  rm -f "$outdir"/mem-*-$tag.html
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
    plans=(--recompute none,per_block)
    [ "$name" = gpu-dense ] || plans=(--recompute none,per_block,offload)
    timeout "$(cap 150)" "$bin/remat" bench --device cuda --dtype bf16 --config "$cfg" "${plans[@]}" \
      --repeats 2 --warmup 1 --steps 3 --json "$outdir/bench-$name.json" > "$outdir/bench-$name.txt" 2>&1
    say "bench $name: rc $?"
    if [ "$name" != gpu-dense ]; then  # the planner at 50% of none's peak, a run of its own (it may find no plan)
      timeout "$(cap 120)" "$bin/remat" bench --device cuda --dtype bf16 --config "$cfg" --recompute none,auto \
        --memory-budget 50% --repeats 2 --warmup 1 --steps 3 --json "$outdir/bench-$name-auto.json" \
        > "$outdir/bench-$name-auto.txt" 2>&1
      say "bench $name auto at 50%: rc $? ($(grep -E 'no plan fits|chose' "$outdir/bench-$name-auto.txt" | head -1 | cut -c1-160))"
    fi
    if [ $torch_ok = 1 ] && [ "$name" != bench-moe ]; then
      timeout "$(cap 90)" python3 "$here/bench_torch.py" --config "$cfg" --device cuda --dtype bf16 --warmup 2 --steps 5 \
        > "$outdir/torch-$name.json" 2> "$outdir/torch-$name.err"
      say "pytorch $name: rc $?"
    fi
  done
  [ $torch_ok = 1 ] || say "pytorch: not usable here (see torch-check.txt); no baseline"
  # Where the dense step's GPU time goes: each kernel table's time per step (bench-worker --kernel-profile).
  for plan in none per_block; do
    timeout "$(cap 60)" "$bin/remat" bench-worker --config "$outdir/gpu-dense.json" --device cuda --dtype bf16 \
      --recompute $plan --warmup 1 --steps 3 --kernel-profile "$outdir/kernels-gpu-dense-$plan.txt" \
      > "$outdir/kernels-gpu-dense-$plan.log" 2>&1
    say "kernel profile gpu-dense $plan: rc $? ($(tail -n 1 "$outdir/kernels-gpu-dense-$plan.txt" 2>/dev/null))"
  done
  python3 "$here/summarize.py" "$outdir" 2>&1 | tee -a "$summary" || say "summary: python3 failed"
fi
say "done in $(( $(date +%s) - start )) s, $failed test binaries failed"
[ $failed -eq 0 ]
