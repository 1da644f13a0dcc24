#!/usr/bin/env bash
# `remat train --save DIR` killed (REMAT_FAULT_SAVE: _exit in the middle of a
# save) after each step of its second save leaves a complete state:
# `--resume DIR` continues from it (step 2 before the rename, 4 after) with
# the losses of the uninterrupted run. A state with one flipped byte in a
# tensor's data is rejected naming the tensor and pointing at the previous
# state.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
remat=./bazel-bin/tools/remat
# tiny, smaller (fast), dropout on (the resumed RNG must be exact too).
echo '{"name": "tiny", "d_model": 32, "n_layers": 2, "n_heads": 2, "ffn": 64, "seq": 32, "batch": 4, "dropout": 0.1}' \
  > "$tmp/small.json"
common=(--config "$tmp/small.json" --steps 6 --save-every 2 --warmup 2 --eval-every 0 --seed 3 --threads 2)
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"; }

$remat train "${common[@]}" --log "$tmp/straight.jsonl" > "$tmp/straight.txt" 2>&1
check "the uninterrupted run" '[ "$(wc -l < "$tmp/straight.jsonl")" -eq 6 ]' || tail -5 "$tmp/straight.txt"
read -r -a all <<< "$(losses "$tmp/straight.jsonl")"

for step in begin writing written rotated renamed synced; do
  d="$tmp/$step"
  REMAT_FAULT_SAVE="$step:2" $remat train "${common[@]}" --save "$d" > "$tmp/crash.txt" 2>&1
  rc=$?
  check "killed after save step '$step' (exit 99)" \
    '[ $rc -eq 99 ] && grep -q "REMAT_FAULT_SAVE: ending the process" "$tmp/crash.txt"' || tail -5 "$tmp/crash.txt"
  from=2
  case $step in renamed|synced) from=4 ;; esac
  $remat train "${common[@]}" --resume "$d" --save "$d" --log "$tmp/rest.jsonl" > "$tmp/rest.txt" 2>&1
  rc=$?
  check "after '$step': --resume continues from step $from to 6" \
    '[ $rc -eq 0 ] && grep -q "resumed at step $from from" "$tmp/rest.txt" && [ "$(wc -l < "$tmp/rest.jsonl")" -eq $((6 - from)) ]' ||
    tail -5 "$tmp/rest.txt"
  read -r -a rest <<< "$(losses "$tmp/rest.jsonl")"
  check "after '$step': the resumed losses are the uninterrupted run's" \
    '[ "${rest[*]}" = "${all[*]:$from}" ]' || echo "    resumed ${rest[*]} vs ${all[*]:$from}"
  case $step in
    writing|written|rotated)
      check "after '$step': the partial save is ignored with a note" \
        'grep -q "note: ignored $d/state.safetensors.tmp" "$tmp/rest.txt"' || tail -5 "$tmp/rest.txt" ;;
  esac
  check "after '$step': no temporary files are left" '[ -z "$(ls "$d" | grep tmp)" ]' || ls "$d"
done

# One flipped bit in the data of lm_head.weight of a real saved state.
d="$tmp/synced"
/usr/bin/python3 - "$d/state.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
(n,) = struct.unpack("<Q", b[:8])
h = json.loads(b[8:8 + n])
b[8 + n + h["lm_head.weight"]["data_offsets"][0] + 100] ^= 0x04
open(p, "wb").write(b)
PY
$remat train "${common[@]}" --steps 8 --resume "$d" > "$tmp/bad.txt" 2>&1
rc=$?
check "a flipped byte: --resume fails naming the tensor, the file and the previous state" \
  '[ $rc -ne 0 ] && grep -q "checksum mismatch in tensor .lm_head.weight." "$tmp/bad.txt" &&
   grep -q "$d/state.safetensors" "$tmp/bad.txt" && grep -q "state.prev.safetensors is intact: step 4" "$tmp/bad.txt"' ||
  cat "$tmp/bad.txt"
check "the error is one line, no loss was printed" '! grep -q "^step" "$tmp/bad.txt"'
finish
