#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (tests/fuzz/targets.h) with
# clang, ASan and UBSan, and runs each for a fixed time.
#
# Usage: tools/fuzz.sh [--seconds N] [--no-build] [TARGET...]
#   TARGET       json, config, plan, safetensors, tokenizer, tokenizer_config,
#                hf_config, hf_index, token_shard, safetensors_decode
#                (default: all ten, one after another)
#   --seconds N  how long each target runs (default 60)
#   --no-build   use the binaries already in out/fuzz-bin
#
# The build has its own Bazel output base ($REMAT_FUZZ_OUTPUT_BASE, default
# ~/.cache/remat-fuzz; convenience links out/fuzz-*), CC=clang and
# REMAT_CUDA_PATH=none, so the main build's cache is untouched. Each run reads
# the seeds in tests/fuzz/corpus/TARGET/ and the past findings in
# tests/fuzz/crashes/TARGET/, keeps the inputs it finds in
# out/fuzz/corpus/TARGET/ (reused by the next run) and writes a crashing
# input to out/fuzz/crashes/TARGET/; logs go to out/fuzz/TARGET.log.
# One line per target: "fuzz TARGET: N executions in S s, K crashes".
# Exits 1 if the build failed or any target found something, 2 if clang or
# libFuzzer is missing, 64 on a bad flag or target.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

all_targets=(json config plan safetensors tokenizer tokenizer_config hf_config hf_index token_shard safetensors_decode)
seconds=60
build=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds)
      [[ "${2:-}" =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] || {
        echo "fuzz: --seconds needs a positive whole number of seconds, got '${2:-}'" >&2
        exit 64
      }
      seconds="$2"
      shift 2
      ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown flag $1; valid flags: --seconds N, --no-build" >&2; exit 64 ;;
    *)
      if [[ " ${all_targets[*]} " != *" $1 "* ]]; then
        echo "fuzz: unknown target '$1'; valid targets: ${all_targets[*]}" >&2
        exit 64
      fi
      targets+=("$1")
      shift
      ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")

cc="${REMAT_FUZZ_CC:-clang}"
if ! command -v "$cc" >/dev/null; then
  echo "fuzz: $cc not found (install the Debian packages clang libclang-rt-14-dev libfuzzer-14-dev: ./remat setup)" >&2
  exit 2
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cc" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz: $cc cannot link libFuzzer (install libclang-rt-14-dev libfuzzer-14-dev: ./remat setup)" >&2
  exit 2
fi

if [ "$build" -eq 1 ]; then
  labels=()
  for t in "${targets[@]}"; do labels+=("//tests/fuzz:${t}_fuzzer"); done
  mkdir -p out
  if ! CC="$cc" REMAT_CUDA_PATH=none bazel --output_base="${REMAT_FUZZ_OUTPUT_BASE:-$HOME/.cache/remat-fuzz}" \
      --max_idle_secs=300 build --config=fuzz --symlink_prefix=out/fuzz- --noshow_progress \
      "${labels[@]}" >out/fuzz-build.log 2>&1; then
    grep -E 'error|ERROR' out/fuzz-build.log | head -30 >&2
    echo "fuzz: build failed, log: out/fuzz-build.log" >&2
    exit 1
  fi
fi

# Stop at the first error of either sanitizer, with a stack, and keep the
# process's exit code for libFuzzer to report.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:symbolize=1}"
tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/remat-fuzz.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT
export REMAT_FUZZ_TMPDIR="$tmpdir"

found=0
for t in "${targets[@]}"; do
  bin="out/fuzz-bin/tests/fuzz/${t}_fuzzer"
  if [ ! -x "$bin" ]; then
    echo "fuzz $t: $bin is missing (run without --no-build)" >&2
    found=1
    continue
  fi
  work="out/fuzz/corpus/$t" crashes="out/fuzz/crashes/$t"
  mkdir -p "$work" "$crashes"
  # The target's own dictionary, else the JSON one.
  dict=(-dict=tests/fuzz/dict/json.dict)
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=(-dict="tests/fuzz/dict/$t.dict")
  seeds=(tests/fuzz/corpus/"$t")
  [ -d "tests/fuzz/crashes/$t" ] && seeds+=("tests/fuzz/crashes/$t")
  log="out/fuzz/$t.log"
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 "${dict[@]}" -artifact_prefix="$crashes/" "$work" "${seeds[@]}" >"$log" 2>&1 &
  pid=$!
  wait "$pid"
  rc=$?
  # libFuzzer ends without running exit handlers, so clang's OpenMP runtime
  # leaves its registration file behind.
  rm -f /dev/shm/__KMP_REGISTERED_LIB_"${pid}"_*
  execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  secs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 | grep -oE '[0-9]+ second' | grep -oE '[0-9]+')
  if [ "$rc" -eq 0 ] && grep -q '^Done [0-9]* runs' "$log"; then
    echo "fuzz $t: ${execs:-?} executions in ${secs:-$seconds} s, 0 crashes"
  else
    found=1
    echo "fuzz $t: ${execs:-?} executions, 1 crash (exit $rc), log: $log"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz target|.*runtime error|    #[0-9] )|^artifact_prefix|Test unit written' "$log" |
      head -20 | sed 's/^/    /'
  fi
done
exit "$found"
