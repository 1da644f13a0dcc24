#!/usr/bin/env bash
# ./remat mem for `tiny` with recompute none and per_block: the JSON shows
# what recompute changes (a lower peak, replay phases, recompute bytes that
# rise and fall once per replayed block during backward: the sawtooth), and
# headless Chromium (Debian's `chromium`, installed by ./remat setup) renders
# both HTML pages into screenshots that are not blank.
# Prints the summary line tools/run_tests.sh adds up.
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {  # check NAME COMMAND...
  local name="$1"
  shift
  if "$@"; then
    passed=$((passed + 1))
    echo "passed: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name"
  fi
}

for plan in none per_block; do
  check "mem --config tiny --recompute $plan writes JSON and HTML" \
    ./bazel-bin/tools/remat mem --config tiny --recompute "$plan" --threads 1 --out "$tmp/$plan"
done

# What recompute changes, from the two JSON files.
check "per_block: lower peak, replay phases, a recompute sawtooth in backward" \
  /usr/bin/python3 - "$tmp/none.json" "$tmp/per_block.json" <<'EOF'
import json, sys

def load(path):
    with open(path) as f:
        j = json.load(f)
    # Replay the events: per-category bytes must add up to the allocator's count.
    cur = dict(j["initial"]["by_category"])
    backward = [(p["t_us"], p["end_us"]) for p in j["phases"] if p["name"] in ("backward", "replay")]
    rec_max_in_backward, rises, prev, rec_max = 0, 0, 0, 0
    for e in j["events"]:
        if e["kind"] in ("alloc", "free"):
            cur[e["category"]] += e["size"] if e["kind"] == "alloc" else -e["size"]
            assert sum(cur.values()) == e["allocated"], (path, e)
        r = cur["recompute"]
        if any(a <= e["t_us"] <= b for a, b in backward):
            rec_max_in_backward = max(rec_max_in_backward, r)
        if prev == 0 and r > 0:
            rises += 1
        prev, rec_max = r, max(rec_max, r)
    names = [p["name"] for p in j["phases"]]
    return j, names, rec_max_in_backward, rises, rec_max

none, none_phases, _, none_rises, none_rec = load(sys.argv[1])
pb, pb_phases, pb_rec_bwd, pb_rises, _ = load(sys.argv[2])
ok = True
def expect(cond, what):
    global ok
    print(("  ok   " if cond else "  FAIL ") + what)
    ok = ok and cond

expect(none["config"] == "tiny" and none["plan"] == "none" and pb["plan"] == "per_block", "config and plan recorded")
expect(pb["peak"]["allocated"] < none["peak"]["allocated"],
       "per_block peak %d < none peak %d" % (pb["peak"]["allocated"], none["peak"]["allocated"]))
for n, ph in (("none", none_phases), ("per_block", pb_phases)):
    expect(ph[:3] == ["zero_grad", "forward", "backward"] and ph[-1] == "optimizer",
           "%s phases: zero_grad, forward, backward ... optimizer (%s)" % (n, ",".join(ph)))
replays = pb_phases.count("replay")
expect(replays == 4, "per_block replays each of tiny's 4 blocks once (%d replay phases)" % replays)
expect("replay" not in none_phases, "none has no replay phase")
expect(pb_rec_bwd > 0, "per_block recompute bytes during backward: up to %d" % pb_rec_bwd)
expect(pb_rises == replays, "per_block recompute bytes rise from 0 once per replay: %d rises (the sawtooth)" % pb_rises)
expect(none_rec == 0 and none_rises == 0, "none never holds recompute bytes")
expect(pb["peak"]["by_category"]["activation"] < none["peak"]["by_category"]["activation"],
       "per_block holds fewer activation bytes at its peak")
expect("checkpoint_boundary" in pb["saved_at_peak_by_op"] and "checkpoint_boundary" not in none["saved_at_peak_by_op"],
       "saved bytes at the peak by op: boundaries under per_block only")
expect(sum(none["saved_at_peak_by_op"].values()) > 0, "none holds saved tensors at its peak")
sys.exit(0 if ok else 1)
EOF

# Render both pages with headless Chromium and check the screenshots.
chrome=""
for c in chromium chromium-browser google-chrome; do
  if command -v "$c" >/dev/null 2>&1; then chrome="$c"; break; fi
done
if [ -z "$chrome" ]; then
  echo "ERROR: headless Chromium is not installed (Debian package 'chromium'; ./remat setup installs it)" >&2
  failed=$((failed + 1))
  echo "FAILED: render the HTML with headless Chromium"
else
  for plan in none per_block; do
    render() {
      HOME="$tmp" timeout 180 "$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$(mktemp -d -p "$tmp")" --screenshot="$tmp/$plan.png" --window-size=1200,800 \
        "file://$tmp/$plan.html" >"$tmp/$plan.chromium.log" 2>&1
      local rc=$?
      [ $rc -eq 0 ] && [ -s "$tmp/$plan.png" ] && return 0
      echo "  chromium exited $rc; its log:"; tail -20 "$tmp/$plan.chromium.log" | sed 's/^/    /'
      return 1
    }
    check "$plan: headless Chromium renders the HTML" render
  done
  check "screenshots are not blank and show the recompute layer only under per_block" \
    /usr/bin/python3 - "$tmp/none.png" "$tmp/per_block.png" <<'EOF'
import struct, sys, zlib

def read_png(path):
    """RGB(A) 8-bit non-interlaced PNG -> (width, height, channels, rows of bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path + ": not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, "unsupported PNG %r" % (ihdr,)
    ch = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = w * ch
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if ft == 1:
            for i in range(ch, stride):
                line[i] = (line[i] + line[i - ch]) & 255
        elif ft == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif ft == 3:
            for i in range(stride):
                left = line[i - ch] if i >= ch else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif ft == 4:
            for i in range(stride):
                a = line[i - ch] if i >= ch else 0
                b = prev[i]
                c = prev[i - ch] if i >= ch else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
        rows.append(line)
        prev = line
    return w, h, ch, rows

ok = True
purple = {}
for path in sys.argv[1:]:
    w, h, ch, rows = read_png(path)
    colours, non_white, near_purple = set(), 0, 0
    for line in rows:
        for i in range(0, len(line), ch):
            px = (line[i], line[i + 1], line[i + 2])
            colours.add(px)
            if px != (255, 255, 255):
                non_white += 1
            # The recompute layer: #9b59b6 at 0.9 opacity over a light band.
            if abs(px[0] - 164) < 24 and abs(px[1] - 102) < 24 and abs(px[2] - 184) < 24:
                near_purple += 1
    share = non_white / float(w * h)
    good = w >= 1000 and h >= 600 and share > 0.2 and len(colours) > 50
    print("  %s %s: %dx%d, %.0f%% non-white pixels, %d colours, %d recompute-coloured pixels"
          % ("ok  " if good else "FAIL", path.rsplit("/", 1)[-1], w, h, 100 * share, len(colours), near_purple))
    ok = ok and good
    purple[path] = near_purple
none_p, pb_p = purple[sys.argv[1]], purple[sys.argv[2]]
layer = pb_p > 2000 and none_p < 200
print("  %s recompute layer drawn under per_block only (%d vs %d pixels)" % ("ok  " if layer else "FAIL", pb_p, none_p))
sys.exit(0 if ok and layer else 1)
EOF
fi

echo "remat-tests: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
