"""pcs.torch's training step on the demo MLP, the model bench/ddp_step.py runs under PyTorch DDP:
PyTorch computes, pcs shards, gathers, reduces and steps. Starts a pcs-coordinator on
127.0.0.1:0, submits the job with pcsctl (program pcs.torch), forks W ranks that join through
pcs.torch, and prints one line: `pcs.torch W=<W> <strategy> prefetch=<0|1> step_ms=<mean over
the timed steps, max over ranks>`.

    python3 bench/torch_step.py BUILD_DIR [-g W] [-s full_shard|no_shard|shard_grad_op]
                                [--no-prefetch] [-w warmup] [-n iters]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ddp_step  # noqa: E402  (the same MLP)


def rank_main(a, addr, ident, out):
    import pcs.torch
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.world))
    torch.manual_seed(13)
    model = pcs.torch.shard(ddp_step.MLP([256] + [1024] * 4, 16), coordinator=addr,
                            identity=ident, join_timeout_ms=60000, coll_timeout_ms=60000,
                            prefetch=not a.no_prefetch)
    g = torch.Generator().manual_seed(7 + model.rank)
    times = []
    for step in range(model.total_steps):
        t0 = time.perf_counter()
        tot = 0.0
        for mb in range(4):
            x = torch.randn(32, 256, generator=g)
            y = torch.randn(32, 16, generator=g)
            with model.no_sync() if mb < 3 else torch.enable_grad():
                loss = F.mse_loss(model(x), y)
                model.backward(loss)
            tot += loss.item()
        model.step(tot / 4)
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    model.finish()
    with open(out, "w") as f:
        json.dump(sum(times) / len(times) * 1e3, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("-g", "--world", type=int, default=4)
    ap.add_argument("-s", "--strategy", default="full_shard")
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("-w", "--warmup", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=5)
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:  # a child: --rank ADDR,IDENT,OUT
        addr, ident, out = a.rank.split(",")
        rank_main(a, addr, ident, out)
        return 0
    import pcs.torch
    binp = os.path.join(os.path.abspath(a.build), "bin")
    env = dict(os.environ, PCS_WORKER_LIBRARY=os.path.join(os.path.abspath(a.build), "lib",
                                                           "libpcs_worker.so.0"),
               PCS_LOG_LEVEL="warn")
    with tempfile.TemporaryDirectory() as d:
        port_file = os.path.join(d, "port")
        coord = subprocess.Popen([os.path.join(binp, "pcs-coordinator"), "--listen",
                                  "127.0.0.1:0", "--port-file", port_file, "--db", ":memory:"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                time.sleep(0.05)
            addr = "127.0.0.1:" + open(port_file).read().strip()
            torch.manual_seed(13)
            spec = pcs.torch.job_spec(
                ddp_step.MLP([256] + [1024] * 4, 16), name="torch-step",
                wrap={"module_class": {"classes": ["Block"]}},
                precision={"param_dtype": "fp32"}, strategy=a.strategy,
                mesh=[{"dim": "dp_shard", "size": a.world}],
                training={"steps": a.warmup + a.iters, "micro_batch_size": 32,
                          "micro_batches": 4, "optimizer": {"adamw": {"lr": 1e-3}},
                          "clip_grad_norm": 1.0})
            job = os.path.join(d, "job.json")
            with open(job, "w") as f:
                json.dump(spec, f)
            outs = [os.path.join(d, "r%d" % i) for i in range(a.world)]
            args = [sys.executable, os.path.abspath(__file__), a.build, "-g", str(a.world),
                    "-s", a.strategy, "-w", str(a.warmup), "-n", str(a.iters)]
            if a.no_prefetch:
                args.append("--no-prefetch")
            ranks = [subprocess.Popen(args + ["--rank", "%s,bench-%d,%s" % (addr, i, outs[i])],
                                      env=env) for i in range(a.world)]
            subprocess.run([os.path.join(binp, "pcsctl"), "--coordinator", addr, "submit", job],
                           check=True, stdout=subprocess.DEVNULL, env=env)
            codes = [r.wait(timeout=600) for r in ranks]
            if any(codes):
                print("pcs.torch W=%d failed: %s" % (a.world, codes))
                return 1
            step_ms = max(json.load(open(o)) for o in outs)
        finally:
            coord.terminate()
            coord.wait()
    print("pcs.torch W=%d %s prefetch=%d step_ms=%.1f" % (a.world, a.strategy,
                                                          0 if a.no_prefetch else 1, step_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
