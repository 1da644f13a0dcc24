"""The Python module's overhead on a training loop: a Python loop driving
remat.Trainer.step() against `./remat train`, same config, seed, threads and
steps, interleaved (CLI, then Python, round after round).

    ./remat python python/bench_overhead.py [--rounds 5] [--steps 40] [--config tiny] [--threads 2]

Per step: the CLI's own step time (its --log `step_ms`, measured inside the
Trainer) against the wall time between two returns of step() in Python
(the step, the GIL hand-over, the dict of figures and the loop itself).
The first 5 steps of each run (warm-up) and the last (it evaluates) are
left out. Prints one JSON object: the medians of both in tokens/s, their
interquartile ranges (tokens/s at the slower and faster quartile step
times) and the ratio of the medians (CLI / Python: 1.0 = no overhead).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import remat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_step_ms(args, flags):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        subprocess.run([os.path.join(ROOT, "bazel-bin/tools/remat"), "train", *flags, "--log", log,
                        "--progress", "off"], check=True, stdout=subprocess.DEVNULL)
        with open(log) as f:
            rows = [json.loads(line) for line in f]
    return [r["step_ms"] for r in rows[5:-1]]


def python_step_ms(args, kwargs):
    trainer = remat.Trainer(**kwargs)
    times = []
    last = time.perf_counter()
    for _ in range(args.steps):
        trainer.step()
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
    return times[5:-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    kwargs = dict(config=args.config, steps=args.steps, seed=0, eval_every=0, threads=args.threads)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items()]
    tokens = remat.ModelConfig(args.config).batch * remat.ModelConfig(args.config).seq
    cli, py = [], []
    for _ in range(args.rounds):
        cli += cli_step_ms(args, flags)
        py += python_step_ms(args, kwargs)
    def tok_s(ms):  # tokens/s at the median step time, and at its quartiles (the spread)
        q1, q2, q3 = statistics.quantiles(ms, n=4)
        return [round(tokens / (q / 1e3), 1) for q in (q2, q3, q1)]

    cli_tok, py_tok = tok_s(cli), tok_s(py)
    print(json.dumps({"config": args.config, "threads": args.threads, "rounds": args.rounds,
                      "steps_measured_each": len(cli), "cli_tokens_per_s": cli_tok[0],
                      "cli_tokens_per_s_iqr": cli_tok[1:], "python_tokens_per_s": py_tok[0],
                      "python_tokens_per_s_iqr": py_tok[1:], "ratio_cli_over_python": round(cli_tok[0] / py_tok[0], 4)}))


if __name__ == "__main__":
    sys.exit(main())
