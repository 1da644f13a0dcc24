#!/usr/bin/env bash
# tokenize --field NAME: JSON Lines in, shards out. The shards of a .jsonl
# (escapes, extra keys, blank and CRLF lines, an empty text) are byte for byte
# those of the same texts as one plain file each, and so are those of the
# texts split over a folder of .jsonl files; each bad line (not JSON, not an
# object, no such member, a member that is not a string) is an error naming
# the file and the line, and leaves --out empty, also when the bad line is in
# the second file of a folder.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
remat=./bazel-bin/tools/remat
tok=tests/tokenizer/data/qwen3

# The texts, as a folder of plain files (sorted by name: one document each)
# and as JSON Lines: ASCII-escaped and raw UTF-8, other members, a blank and a
# whitespace-only line, a CRLF line ending, an empty text.
/usr/bin/python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
texts = ["Hello, world!\nThe second line of the first document.\n",
         "Ünïcödé 😀 with a \"quote\", a back\\slash and a\ttab",
         "",
         "<|endoftext|> is a special token's text inside a document.",
         "  leading spaces, a trailing newline\r\n"]
os.makedirs(f"{tmp}/text")
for i, t in enumerate(texts):
    open(f"{tmp}/text/{i}.txt", "w", encoding="utf-8", newline="").write(t)
lines = [json.dumps({"id": 0, "text": texts[0], "meta": {"text": 1}}),
         "",
         json.dumps({"text": texts[1]}, ensure_ascii=False) + "\r",
         "   \t",
         json.dumps({"text": texts[2], "tags": ["a"]}),
         json.dumps({"source": "x", "text": texts[3]}),
         json.dumps({"text": texts[4]})]
open(f"{tmp}/data.jsonl", "w", encoding="utf-8", newline="").write("\n".join(lines) + "\n")
os.makedirs(f"{tmp}/split")
open(f"{tmp}/split/a.jsonl", "w", encoding="utf-8").write("\n".join(lines[:3]) + "\n")
open(f"{tmp}/split/b.jsonl", "w", encoding="utf-8").write("\n".join(lines[3:]))  # no final newline
PY

$remat tokenize --tokenizer "$tok" --data "$tmp/text" --out "$tmp/plain" > "$tmp/plain.txt" 2>&1
check "plain text folder tokenizes" 'grep -q "^tokenize: 5 documents" "$tmp/plain.txt"' || cat "$tmp/plain.txt"
$remat tokenize --tokenizer "$tok" --data "$tmp/data.jsonl" --field text --out "$tmp/jsonl" > "$tmp/jsonl.txt" 2>&1
check "--field text: 5 documents from the JSON Lines" \
  'grep -q "^tokenize: 5 documents" "$tmp/jsonl.txt" && grep -q "MB of JSON Lines" "$tmp/jsonl.txt"' ||
  cat "$tmp/jsonl.txt"
check "--field text: the shards are those of the plain files" \
  'cmp "$tmp/plain/shard-00000.tok" "$tmp/jsonl/shard-00000.tok" && [ "$(ls "$tmp/jsonl")" = shard-00000.tok ]'
$remat tokenize --tokenizer "$tok" --data "$tmp/split" --field text --out "$tmp/split-out" > "$tmp/split.txt" 2>&1
check "--field text on a folder of .jsonl: the same shards" \
  'cmp "$tmp/plain/shard-00000.tok" "$tmp/split-out/shard-00000.tok"' || cat "$tmp/split.txt"
/usr/bin/python3 - "$tmp/jsonl/shard-00000.tok" > "$tmp/eos.txt" 2>&1 <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
width, count = struct.unpack_from("<I", d, 8)[0], struct.unpack_from("<Q", d, 16)[0]
eos, docs = struct.unpack_from("<q", d, 48)[0], struct.unpack_from("<Q", d, 56)[0]
ids = [int.from_bytes(d[64 + width * i:64 + width * (i + 1)], "little") for i in range(count)]
assert docs == 5 and eos >= 0 and ids.count(eos) == 5 and ids[-1] == eos, (docs, eos, ids)
PY
rc=$?
check "the shard holds 5 documents, each ended by EOS" '[ $rc -eq 0 ]' || cat "$tmp/eos.txt"

# Bad inputs: the error names the file and the line, and nothing is written.
n=0
expect_error() {  # NAME PATTERN FILE-CONTENTS [FILE-CONTENTS ...] (several: a folder of files)
  local what=$1 pattern=$2 data
  shift 2
  n=$((n + 1))
  if [ $# -eq 1 ]; then
    data=$tmp/bad$n.jsonl
    printf '%s' "$1" > "$data"
  else
    data=$tmp/bad$n
    mkdir -p "$data"
    local i=0
    for c in "$@"; do i=$((i + 1)); printf '%s' "$c" > "$data/$i.jsonl"; done
  fi
  $remat tokenize --tokenizer "$tok" --data "$data" --field text --out "$tmp/out$n" > "$tmp/err.txt" 2>&1
  local rc=$?
  check "$what" '[ $rc -ne 0 ] && grep -qF -- "$pattern" "$tmp/err.txt" && [ -z "$(ls -A "$tmp/out$n")" ]' ||
    { cat "$tmp/err.txt"; ls -A "$tmp/out$n"; }
}
good='{"text": "fine"}'
expect_error "not JSON: names the line, the column and the parser's reason" \
  "bad1.jsonl line 3 is not valid JSON (column 15: syntax error while parsing object key - unexpected '}'" \
  $'{"text": "a"}\n\n{"text": "b", }\n'
expect_error "an unterminated string" "bad2.jsonl line 1 is not valid JSON (column" $'{"text": "abc\n'
expect_error "invalid UTF-8" "bad3.jsonl line 2 is not valid JSON" "$good"$'\n{"text": "\xff"}'
expect_error "not an object" "bad4.jsonl line 2 is an array, not a JSON object" "$good"$'\n["text"]\n'
expect_error "a bare string" "bad5.jsonl line 1 is a string, not a JSON object" '"text"'
expect_error "no such member: lists the keys" \
  'bad6.jsonl line 2 has no member "text" (its keys: "completion", "prompt")' \
  "$good"$'\n{"prompt": "p", "completion": "c"}\n'
expect_error "no such member: many keys are cut short" \
  'line 1 has no member "text" (its keys: "k0", "k1", "k10", "k11", "k2", "k3", "k4", "k5", ... (12 in all))' \
  "$(/usr/bin/python3 -c 'import json; print(json.dumps({f"k{i}": i for i in range(12)}))')"
expect_error "an empty object" 'bad8.jsonl line 1 has no member "text" (its keys: none)' '{}'
expect_error "a number" 'bad9.jsonl line 1: member "text" is a number, not a string' '{"text": 42}'
expect_error "null" 'bad10.jsonl line 2: member "text" is null, not a string' "$good"$'\n{"text": null}'
expect_error "an array of messages" 'line 1: member "text" is an array, not a string' '{"text": ["a", "b"]}'
expect_error "a bad line in the second file of a folder: nothing is written" \
  "bad12/2.jsonl line 2 has no member" "$good"$'\n'"$good" "$good"$'\n{"txt": "typo"}\n'

$remat tokenize --tokenizer "$tok" --data "$tmp/data.jsonl" --field text --json > "$tmp/e.txt" 2>&1
rc=$?
check "--field with --json is refused" '[ $rc -ne 0 ] && grep -q "give it with --out DIR" "$tmp/e.txt"' ||
  cat "$tmp/e.txt"
$remat tokenize --tokenizer "$tok" --data "$tmp/data.jsonl" --field "" --out "$tmp/o" > "$tmp/e.txt" 2>&1
rc=$?
check "an empty --field is refused" '[ $rc -ne 0 ] && grep -q "needs the member" "$tmp/e.txt"' || cat "$tmp/e.txt"
finish
