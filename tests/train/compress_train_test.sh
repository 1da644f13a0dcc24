#!/usr/bin/env bash
# Training with compressed and offloaded saved tensors: 300 steps of tiny
# under compress:fp8 end within 1% of the uncompressed run's validation loss
# (compression is lossy, measured here); offload is exact (the same loss to
# the printed digit); --log carries the offload/compression keys; a spill
# directory that cannot take the file is a clear error.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
remat=./bazel-bin/tools/remat
common=(--config tiny --steps 300 --eval-every 0 --progress off)
val() { sed -nE 's/.*validation loss ([0-9.]+).*/\1/p' "$1"; }
$remat train "${common[@]}" > "$tmp/none.txt" 2>&1
$remat train "${common[@]}" --recompute compress:fp8 --log "$tmp/fp8.jsonl" > "$tmp/fp8.txt" 2>&1
$remat train "${common[@]}" --steps 20 --recompute offload --offload-dir "$tmp" --log "$tmp/off.jsonl" > "$tmp/off.txt" 2>&1
$remat train "${common[@]}" --steps 20 > "$tmp/none20.txt" 2>&1
a=$(val "$tmp/none.txt") b=$(val "$tmp/fp8.txt")
check "compress:fp8 trains: validation loss $b within 1% of none's $a" \
  "[ -n '$a' ] && [ -n '$b' ] && awk -v a='$a' -v b='$b' 'BEGIN { d = (b - a) / a; exit !(d < 0.01 && d > -0.01) }'" ||
  tail -3 "$tmp/fp8.txt"
check "offload is exact: the same validation loss as none" \
  "[ -n \"\$(val '$tmp/off.txt')\" ] && [ \"\$(val '$tmp/off.txt')\" = \"\$(val '$tmp/none20.txt')\" ]" || tail -3 "$tmp/off.txt"
check "--log: compressed_saved_bytes > 0 under compress:fp8" \
  "grep -q '\"compressed_saved_bytes\": [1-9]' '$tmp/fp8.jsonl'"
check "--log: offloaded_bytes > 0 and offload_ms under offload" \
  "grep -q '\"offloaded_bytes\": [1-9]' '$tmp/off.jsonl' && grep -q '\"offload_ms\": ' '$tmp/off.jsonl'"
check "the spill file left nothing in --offload-dir" "[ -z \"\$(ls '$tmp' | grep remat-offload)\" ]"
check "an --offload-dir that cannot take the file is a clear error" \
  "! $remat train ${common[*]} --steps 2 --recompute offload --offload-dir /nonexistent/dir > '$tmp/bad.txt' 2>&1 &&
   grep -q \"offload: cannot create a spill file in '/nonexistent/dir'\" '$tmp/bad.txt'"
finish
