#!/usr/bin/env bash
# `remat train --progress`: under mpirun (whose ranks get a pty, so isatty()
# is true) the default `auto` writes plain lines, so a redirected log holds no
# '\r' and one line per progress update (every 10th step and each
# evaluation); `--progress bar` draws the '\r' line even into a pipe; `off`
# prints no step lines but still the summary; a bad value names the choices.
# On a pty without a launcher `auto` draws the bar; with srun's variables set
# it does not.
set -u
# shellcheck source=tests/script_checks.sh
source "$(dirname "$(readlink -f "$0")")/../script_checks.sh"
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
remat=./bazel-bin/tools/remat
common=(--config tiny --steps 20 --warmup 2 --eval-every 0 --seed 1 --threads 1)
cr=$'\r'

# The step numbers of the progress lines in file $1 (lines that start with "step").
step_lines() { grep -aoE "^step +[0-9]+/" "$1" | grep -oE "[0-9]+" | tr '\n' ' '; }

timeout 120 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" > "$tmp/auto.txt" 2>&1
rc=$?
check "mpirun -np 2 train (auto) runs" '[ $rc -eq 0 ] && grep -q "^done: 20 steps" "$tmp/auto.txt"' || tail -5 "$tmp/auto.txt"
check "... its log holds no carriage return" '! grep -q "$cr" "$tmp/auto.txt"' || od -c "$tmp/auto.txt" | head
check "... and one line per progress update: steps 10 and 20 (the evaluation)" \
  '[ "$(step_lines "$tmp/auto.txt")" = "10 20 " ] && grep -qE "^step +20/20 .*  val [0-9.]+$" "$tmp/auto.txt"' \
  || cat "$tmp/auto.txt"

timeout 120 mpirun "${flags[@]}" -np 2 $remat train "${common[@]}" --progress off > "$tmp/off.txt" 2>&1
rc=$?
check "--progress off under mpirun: no step lines, the summary still prints" \
  '[ $rc -eq 0 ] && [ -z "$(step_lines "$tmp/off.txt")" ] && ! grep -q "step " "$tmp/off.txt" &&
   ! grep -q "$cr" "$tmp/off.txt" && grep -q "^done: 20 steps" "$tmp/off.txt"' || cat "$tmp/off.txt"

# An explicit bar into a pipe (not a terminal): one '\r' per step, and the
# summary on a line of its own.
$remat train "${common[@]}" --progress bar 2>&1 | cat > "$tmp/bar.txt"
check "--progress bar into a pipe redraws with '\\r', once per step" \
  '[ "$(tr -cd "$cr" < "$tmp/bar.txt" | wc -c)" -eq 20 ] && grep -q "^done: 20 steps" "$tmp/bar.txt"' \
  || od -c "$tmp/bar.txt" | tail
$remat train "${common[@]}" --progress lines > "$tmp/lines.txt" 2>&1
check "--progress lines without a launcher: the same lines as auto under mpirun" \
  '[ "$(step_lines "$tmp/lines.txt")" = "10 20 " ] && ! grep -q "$cr" "$tmp/lines.txt"'

# On a terminal (script gives the process a pty, whose output turns '\n'
# into '\r\n'): auto draws the bar ('\r' right before "step"), unless a
# launcher started the process.
script -qec "$remat train ${common[*]}" /dev/null > "$tmp/pty.txt" 2>&1
check "auto on a terminal without a launcher draws the bar" 'grep -aq "${cr}step  *1/20" "$tmp/pty.txt"' \
  || od -c "$tmp/pty.txt" | head
SLURM_STEP_ID=0 SLURM_PROCID=0 script -qec "$remat train ${common[*]}" /dev/null > "$tmp/srun.txt" 2>&1
check "auto on a terminal under srun's variables writes lines" \
  '! grep -aq "${cr}step" "$tmp/srun.txt" && [ "$(grep -ac "^step " "$tmp/srun.txt")" -eq 2 ]' \
  || od -c "$tmp/srun.txt" | head

$remat train --config tiny --steps 1 --progress fancy > "$tmp/bad.txt" 2>&1
rc=$?
check "a bad --progress value is refused, naming the flag, the value and the choices" \
  '[ $rc -ne 0 ] && grep -q "flag --progress expects auto, bar, lines or off, got '"'fancy'"'" "$tmp/bad.txt"' \
  || cat "$tmp/bad.txt"

finish
