"""PyTorch's gloo collectives at the sizes pcs-coll-bench measures, for bench/coll_vs_torch.sh:
all_reduce (fp32 sum) and the reduce-scatter fallbacks torch 1.13's gloo backend leaves a user
(it has no reduce_scatter): all_reduce of the whole input then slicing this rank's chunk, and
all_to_all_single of the chunks then a local sum.

    python3 bench/torch_coll.py [-g W] [-b min_bytes] [-e max_bytes] [-f factor] [-n iters] [-w warmup]

Sizes are total bytes as in nccl-tests (all_reduce: count * 4; reduce-scatter: ranks * recv count
* 4). Prints one line per op and size: `<op> <bytes> <us>` with the mean over the timed
iterations, max over ranks. Ranks are forked processes rendezvousing through a file store.
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def sizes(a):
    s = a.min_bytes
    while s <= a.max_bytes:
        yield s
        s = int(s * a.factor)


def timed(fn, a):
    for _ in range(a.warmup):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        fn()
    us = torch.tensor([(time.perf_counter() - t0) / a.iters * 1e6], dtype=torch.float64)
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def rank_main(r, a, init_file, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=r,
                            world_size=a.world)
    W = a.world
    out = []
    for b in sizes(a):
        n = b // 4
        x = torch.ones(n)
        out.append(("all_reduce", b, timed(lambda: dist.all_reduce(x), a)))
        rc = n // W
        if rc == 0:
            continue
        y = torch.ones(rc * W)

        def ar_slice():
            t = y.clone()
            dist.all_reduce(t)
            return t[r * rc:(r + 1) * rc].clone()

        out.append(("rs_allreduce", b, timed(ar_slice, a)))
        recv = torch.empty(rc * W)

        def a2a_sum():
            dist.all_to_all_single(recv, y)
            return recv.view(W, rc).sum(0)

        try:
            out.append(("rs_alltoall", b, timed(a2a_sum, a)))
        except RuntimeError:  # a gloo build without all_to_all
            pass
    if r == 0:
        q.put(out)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-g", "--world", type=int, default=2)
    p.add_argument("-b", "--min-bytes", type=int, default=64 << 10)
    p.add_argument("-e", "--max-bytes", type=int, default=64 << 20)
    p.add_argument("-f", "--factor", type=float, default=4.0)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    a = p.parse_args()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        procs = [ctx.Process(target=rank_main, args=(r, a, init, q)) for r in range(a.world)]
        for pr in procs:
            pr.start()
        res = q.get()
        for pr in procs:
            pr.join()
    for op, b, us in res:
        print(f"{op} {b} {us:.1f}")


if __name__ == "__main__":
    main()
