#!/usr/bin/env bash
# Real data end to end through the CLI: tokenize text with a real tokenizer
# (Mistral NeMo's tokenizer.json) into shards, train on them (validation loss
# falls), evaluate the saved state and generate from it; tokenize --json /
# --decode round trip; bad inputs get clear errors.
set -u
# shellcheck source=../script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"  # cd to the root, $tmp, counters, finish
remat=./bazel-bin/tools/remat
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }

# The tokenizer fixture (possibly stored compressed).
tok=$tmp/mistral_nemo
mkdir -p "$tok"
src=tests/tokenizer/data/mistral_nemo
if [ -f "$src/tokenizer.json" ]; then cp "$src/tokenizer.json" "$tok/"; else xz -dc "$src/tokenizer.json.xz" > "$tok/tokenizer.json"; fi
[ -f "$src/tokenizer_config.json" ] && cp "$src/tokenizer_config.json" "$tok/"

# A corpus of real English text: this repository's documentation, one
# document per file (the prose last: the held-out tail of each shard is
# text, not the op table).
mkdir -p "$tmp/text"
cp README.md "$tmp/text/a.txt"
cat docs/REFERENCE.md docs/RECOMPUTE.md docs/PARALLEL.md docs/ARCHITECTURE.md > "$tmp/text/b.txt"

# --json and --decode round trip.
printf 'In the beginning God created the heaven and the earth.\n  Ünïcödé 😀 123456\n' > "$tmp/one.txt"
if $remat tokenize --tokenizer "$tok" --data "$tmp/one.txt" --json > "$tmp/ids.json" &&
   $remat tokenize --tokenizer "$tok" --data "$tmp/ids.json" --decode > "$tmp/back.txt" &&
   cmp -s "$tmp/one.txt" "$tmp/back.txt"; then ok; else bad "tokenize --json / --decode round trip"; fi

# Shards.
if $remat tokenize --tokenizer "$tok" --data "$tmp/text" --out "$tmp/shards" --shard-tokens 20000 \
     > "$tmp/tok.txt" 2> "$tmp/tok.err" && ls "$tmp/shards"/shard-*.tok > /dev/null 2>&1 &&
   grep -q "^tokenize: 2 documents" "$tmp/tok.txt"; then ok; else bad "tokenize --out"; cat "$tmp/tok.txt" "$tmp/tok.err"; fi

# Train: the validation loss falls clearly from ln(vocab) (~11.8 for 131072).
if $remat train --config tiny --data "$tmp/shards" --tokenizer "$tok" --steps 60 --eval-every 30 --lr 3e-3 \
     --batch 8 --seq 64 --grad-accum 2 --progress off --save "$tmp/state" --log "$tmp/log.jsonl" > "$tmp/train.txt" 2>&1 &&
   /usr/bin/python3 - "$tmp/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
vals = [r["val_loss"] for r in rows if "val_loss" in r]
assert len(vals) == 2 and vals[-1] < 8.0 and vals[-1] < vals[0], vals
PY
then ok; else bad "train on shards"; tail -5 "$tmp/train.txt"; fi
grep -q "vocabulary 256 of config tiny set to the shards' 131072" "$tmp/train.txt" && ok || bad "train notes the vocabulary"

# eval reproduces the last evaluation; generate continues a prompt.
if $remat eval --resume "$tmp/state" --json - > "$tmp/eval.json" &&
   /usr/bin/python3 - "$tmp/eval.json" "$tmp/log.jsonl" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
last = [json.loads(l) for l in open(sys.argv[2])][-1]
assert abs(e["val_loss"] - last["val_loss"]) < 1e-6 and e["step"] == 60, (e, last["val_loss"])
PY
then ok; else bad "eval"; cat "$tmp/eval.json"; fi
if $remat generate --resume "$tmp/state" --prompt "The recompute plan" --max-new 12 --temperature 0 \
     > "$tmp/gen.txt" 2>&1 &&
   /usr/bin/python3 -c 'import sys; t = open(sys.argv[1], encoding="utf-8").read(); p = "The recompute plan"
assert t.startswith(p) and len(t) >= len(p) + 2, repr(t)' "$tmp/gen.txt"; then ok; else bad "generate"; cat "$tmp/gen.txt"; fi

# Errors.
expect_error() {
  local what=$1 pattern=$2
  shift 2
  if "$@" > "$tmp/err.txt" 2>&1; then bad "$what: expected an error"; return; fi
  grep -q -- "$pattern" "$tmp/err.txt" && ok || { bad "$what: error does not say '$pattern'"; cat "$tmp/err.txt"; }
}
expect_error "shards into a used folder" "is not empty" \
  $remat tokenize --tokenizer "$tok" --data "$tmp/text" --out "$tmp/shards"
mkdir -p "$tmp/other" && echo mine > "$tmp/other/notes.txt"
expect_error "shards into a folder with other files" "is not empty (it holds notes.txt)" \
  $remat tokenize --tokenizer "$tok" --data "$tmp/text" --out "$tmp/other"
[ "$(cat "$tmp/other/notes.txt")" = mine ] && [ "$(ls "$tmp/other")" = notes.txt ] && ok || bad "the other folder was written into"
expect_error "no tokenizer" "cannot\|not found\|neither\|no such" \
  $remat tokenize --tokenizer "$tmp/nothing" --data "$tmp/one.txt" --json
expect_error "two modes" "exactly one of" $remat tokenize --tokenizer "$tok" --data "$tmp/one.txt" --json --decode
head -c 100 "$tmp/shards/shard-00000.tok" > "$tmp/bad.tok"
expect_error "truncated shard" "truncated" $remat train --config tiny --data "$tmp/bad.tok" --steps 1

# The shards remember their tokenizer (XXH3 of its tokenizer.json): another
# tokenizer is refused, naming both hashes; so is mixing shards of two.
qwen=tests/tokenizer/data/qwen3
want_hash=$(/usr/bin/python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); print(d[32:48].decode())' "$tmp/shards/shard-00000.tok")
expect_error "shards with another --tokenizer" "is not the tokenizer --data $tmp/shards was made with (hash $want_hash)" \
  $remat train --config tiny --data "$tmp/shards" --tokenizer "$qwen" --steps 1
mkdir -p "$tmp/qtext" && cp "$tmp/one.txt" "$tmp/qtext/" &&
  $remat tokenize --tokenizer "$qwen" --data "$tmp/qtext" --out "$tmp/qshards" > /dev/null 2>&1 || bad "tokenize with qwen3"
mkdir -p "$tmp/mixed" && cp "$tmp/shards/shard-00000.tok" "$tmp/mixed/" && cp "$tmp/qshards/shard-00000.tok" "$tmp/mixed/shard-00001.tok"
expect_error "shards of two tokenizers" "was made with tokenizer .* (vocabulary 151669), but .* with $want_hash (vocabulary 131072)" \
  $remat train --config tiny --data "$tmp/mixed" --steps 1
finish
