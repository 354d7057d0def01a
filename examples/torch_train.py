"""Train a PyTorch module on pcs: a small transformer-like language model whose output
projection is tied to its embedding, sharded (FULL_SHARD) across the job's ranks with bf16
compute and fp32 gradient reduction; PyTorch does the math, pcs owns the fp32 shards, the
all-gathers and reduce-scatters, the optimizer and the step reports.

    python3 examples/torch_train.py --write-job job.json        # the job spec for this model
    pcsctl submit job.json
    python3 examples/torch_train.py --coordinator 127.0.0.1:7070 &   # once per rank (2)
    python3 examples/torch_train.py --coordinator 127.0.0.1:7070

Every rank builds the module from the same seed (pcs takes the initial values from the module,
so they must agree) and reads its rows of each global batch. Exits 0 if the loss went
down. Needs python3-torch and the pcs package (`cmake --install`, or PYTHONPATH=python in a
source checkout with a build in build/).
"""

import argparse
import contextlib
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

import pcs.torch

VOCAB, DIM, SEQ = 64, 32, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(self.norm(h))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(Block(), Block())
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's

    def forward(self, tokens):
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def build():
    torch.manual_seed(0)
    return TinyLM()


def job():
    return pcs.torch.job_spec(
        build(), name="torch-tiny-lm",
        wrap={"explicit": {"paths": ["blocks.0", "blocks.1"]}},
        precision={"param_dtype": "bf16", "reduce_dtype": "fp32"},
        strategy="full_shard",
        mesh=[{"dim": "dp_shard", "size": 2}],
        training={"steps": 40, "micro_batch_size": 8, "micro_batches": 2,
                  "optimizer": {"adamw": {"lr": 1e-2, "weight_decay": 0.0}},
                  "clip_grad_norm": 1.0})


def batch(step, mb, rows):
    """A learnable sequence task: each row counts up by its own stride modulo VOCAB."""
    g = torch.Generator().manual_seed(1 + 1000 * step + mb)
    start = torch.randint(0, VOCAB, (rows, 1), generator=g)
    stride = torch.randint(1, 4, (rows, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-job", metavar="FILE", help="write the job spec and exit")
    ap.add_argument("--coordinator", default="127.0.0.1:7070")
    ap.add_argument("--identity", default=None)
    a = ap.parse_args()
    if a.write_job:
        with open(a.write_job, "w") as f:
            json.dump(job(), f, indent=1)
        return 0
    torch.set_num_threads(1)
    model = pcs.torch.shard(build(), coordinator=a.coordinator, identity=a.identity)
    rows, r = model.micro_batch_size, model.dp_rank
    first = last = None
    for step in range(model.total_steps):
        losses = []
        for mb in range(model.micro_batches):
            x, y = batch(step, mb, rows * model.dp_size)
            x, y = x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
            sync = mb + 1 == model.micro_batches
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
                model.backward(loss)
            losses.append(loss.item())
        res = model.step(sum(losses) / len(losses))
        first = res.loss if first is None else first
        last = res.loss
        if model.rank == 0 and (step % 10 == 0 or res.done):
            print("step %3d  loss %.4f  grad_norm %.4f" % (res.step, res.loss, res.grad_norm),
                  flush=True)
    rank = model.rank
    model.finish()
    print("rank %d: loss %.4f -> %.4f" % (rank, first, last))
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
