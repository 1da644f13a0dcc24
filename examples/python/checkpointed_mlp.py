"""A checkpointed MLP with a saved-tensor hook written in Python that counts
the bytes autograd keeps for backward.

    ./remat python examples/python/checkpointed_mlp.py

Two passes over the same block and seed: plain, then as a checkpoint region
(its saves dropped and recomputed by backward). The hook sees every save
outside the region; inside it only the region's boundary is kept. The
gradients of both passes are compared bit for bit.
"""
import numpy as np

import remat


def mlp(x, w1, w2):
    return remat.linear(remat.silu(remat.linear(x, w1)), w2)


def run(checkpointed):
    remat.manual_seed(0)
    x = remat.randn((2048, 256), requires_grad=True)
    w1 = remat.randn((1024, 256), requires_grad=True)
    w2 = remat.randn((256, 1024), requires_grad=True)
    counted = {"saves": 0, "bytes": 0}

    def pack(t, info):  # called once per tensor saved for backward
        counted["saves"] += 1
        counted["bytes"] += info.bytes
        return t

    def unpack(t, info):
        return t

    with remat.saved_tensors_hooks(pack, unpack, with_info=True):
        y = remat.checkpoint(mlp, x, w1, w2) if checkpointed else mlp(x, w1, w2)
        loss = (y * y).mean()
    loss.backward()
    grads = [t.grad.numpy().copy() for t in (x, w1, w2)]
    return counted, loss.item(), grads


plain, loss_plain, g_plain = run(False)
ckpt, loss_ckpt, g_ckpt = run(True)
print(f"plain:        {plain['saves']} saves, {plain['bytes'] / 2**20:.2f} MiB kept for backward")
print(f"checkpointed: {ckpt['saves']} saves, {ckpt['bytes'] / 2**20:.2f} MiB kept for backward")
print(f"loss {loss_plain:.6f} / {loss_ckpt:.6f}; checkpoint replays {remat.checkpoint_counters()['replays']}")
same = all(np.array_equal(a, b) for a, b in zip(g_plain, g_ckpt))
print("gradients bit-identical:", "yes" if same else "NO")
assert same and ckpt["bytes"] < plain["bytes"]
