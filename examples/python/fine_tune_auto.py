"""Fine-tune a Hugging Face folder with LoRA adapters, the recompute plan
chosen by remat's planner for a memory budget, driven step by step from
Python.

    /usr/bin/python3 tools/reference/make_hf_model.py --arch llama --tied --out /tmp/tiny-llama
    ./remat python examples/python/fine_tune_auto.py /tmp/tiny-llama

The Trainer takes the train command's flags as keyword arguments (dashes as
underscores); each step() returns the figures of its --log line.
"""
import sys

import remat

model_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-llama"
steps = 30
trainer = remat.Trainer(model=model_dir, lora="r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj",
                        recompute="auto", memory_budget="60%", steps=steps, batch=4, seq=64,
                        lr=3e-3, warmup=3, eval_every=0, threads=1)
print(f"plan chosen for 60% of none's activations: {trainer.options.recompute}")
trainable = trainer.model.trainable_parameters()
print(f"{len(trainable)} adapter tensors train, {sum(t.numel() for _, t in trainable)} parameters;"
      f" {trainer.model.num_parameters()} in all")
first = None
for _ in range(steps):
    s = trainer.step()
    first = first if first is not None else s["loss"]
    if s["step"] % 10 == 0:
        print(f"step {s['step']:3d}  loss {s['loss']:.4f}  peak {s['peak_allocated_bytes'] / 2**20:.1f} MiB"
              f"  {s['tokens_per_s']:.0f} tok/s")
val = trainer.evaluate()
print(f"loss {first:.4f} -> {s['loss']:.4f}; held-out loss {val:.4f}")
assert s["loss"] < first
