"""PyTorch DDP baseline for pcs-step-bench: the same demo model (MLP 256-1024x4-16, Linear +
LayerNorm + GELU blocks with residuals, a Linear head, MSE), the same work per step (4
micro-batches of 32 rows per rank, no_sync on the first three, AdamW lr 1e-3, clip_grad_norm 1.0)
over the gloo backend on W forked ranks with BLAS threads = CPUs / W, as pcs-worker sizes them.

    python3 bench/ddp_step.py [-g W] [-w warmup] [-n iters]

Prints one line: `ddp W=<W> step_ms=<mean over the timed steps, max over ranks> rss_mb=<peak RSS,
max over ranks>`. fp32 only: torch 1.13's CPU autocast to bf16 fails on this model ("expected
scalar type BFloat16 but found Float"). Used by bench/pcs_vs_ddp.sh (interleaved rounds).
"""

import argparse
import os
import resource
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.linear = nn.Linear(i, o)
        self.norm = nn.LayerNorm(o)
        self.act = nn.GELU()
        self.residual = i == o

    def forward(self, x):
        h = self.act(self.norm(self.linear(x)))
        return h + x if self.residual else h


class MLP(nn.Module):
    def __init__(self, dims, out):
        super().__init__()
        self.layers = nn.ModuleList(Block(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], out)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


def rank_main(r, a, init_file, q):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.world))
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=r,
                            world_size=a.world)
    torch.manual_seed(13)
    model = nn.parallel.DistributedDataParallel(MLP([256] + [1024] * 4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(7 + r)
    times = []
    for step in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for mb in range(4):
            x = torch.randn(32, 256, generator=g)
            y = torch.randn(32, 16, generator=g)
            ctx = model.no_sync() if mb < 3 else torch.enable_grad()
            with ctx:
                out = model(x)
                loss = F.mse_loss(out.float(), y) / 4
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    mean = torch.tensor([sum(times) / len(times) * 1e3,
                         resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    if r == 0:
        q.put((mean[0].item(), mean[1].item()))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-g", "--world", type=int, default=4)
    ap.add_argument("-w", "--warmup", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=5)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=rank_main, args=(r, a, os.path.join(d, "init"), q))
                 for r in range(a.world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            print("ddp W=%d failed" % a.world)
            return 1
        step_ms, rss = q.get()
    print("ddp W=%d step_ms=%.1f rss_mb=%.1f" % (a.world, step_ms, rss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
