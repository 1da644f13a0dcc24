#!/usr/bin/env bash
# No function above ops/ is longer than 80 lines (function_lengths.py, which
# prints the five longest), and the counter itself measures what it claims on
# a small tree: a free function, a member defined out of class, one defined
# in a class, a namespace-scope lambda, and braces inside comments, strings
# and initializers that must not be counted as functions. Needs no build.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
counter=tests/layering/function_lengths.py
py=/usr/bin/python3

$py $counter --limit 80 > "$tmp/tree.txt" 2>&1
rc=$?
check "no function above ops/ is over 80 lines" '[ $rc -eq 0 ]' || cat "$tmp/tree.txt"
sed -n 1,5p "$tmp/tree.txt"

mkdir -p "$tmp/t/train"
cat > "$tmp/t/train/a.cc" <<'CC'
namespace remat {
namespace {
const int kTable[] = {1, 2, 3};  // { not a function
}  // namespace
int free_fn(int x) {
  const char* s = "}}}";
  if (x) {
    return 1;
  }
  return 0;
}
struct S {
  int inside(int y) const {
    return y;
  }
};
void S::outside() {
  /* } */
}
const auto lambda = [](int v) {
  return v;
};
}  // namespace remat
CC
$py $counter --root "$tmp/t" --limit 4 --top 10 > "$tmp/small.txt" 2>&1
rc=$?
check "the small tree's functions are found with their lengths" \
  'grep -qE "^ +7 train/a.cc:5 free_fn$" "$tmp/small.txt" && grep -qE "^ +3 train/a.cc:13 inside$" "$tmp/small.txt" &&
   grep -qE "^ +3 train/a.cc:17 S::outside$" "$tmp/small.txt" && grep -qE "^ +3 train/a.cc:20 lambda$" "$tmp/small.txt" &&
   grep -qx "4 functions, 1 over 4 lines" "$tmp/small.txt"' || cat "$tmp/small.txt"
check "a function over the limit fails the check, naming file, line and length" \
  '[ $rc -eq 1 ] && grep -qx "over 4: 7 lines train/a.cc:5 free_fn" "$tmp/small.txt"' || cat "$tmp/small.txt"
finish
