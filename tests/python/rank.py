"""One rank of a pcs.torch test job: builds the case's model (seeded, as every rank and the
reference do), joins the job through pcs.torch, trains it on its rows of each global
micro-batch, and writes what the test compares (torch.save): each step's result, the
parameters after the last step, and the dtypes its hooks saw in the first step (each
submodule's floating input and parameter dtypes in forward, each parameter's gradient dtype).

    python3 rank.py --case NAME --coordinator ADDR --identity ID --out FILE
"""

import argparse
import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import cases  # noqa: E402
import pcs.torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--identity", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    name, _ = cases.job(a.case)
    module = cases.build_case(a.case)
    model = pcs.torch.shard(module, coordinator=a.coordinator, identity=a.identity,
                            join_timeout_ms=60000, coll_timeout_ms=20000)
    seen = {"inputs": {}, "params": {}, "grads": {}, "buffers": {}, "after_backward": {},
            "outputs": {}, "eval": {"inputs": {}, "params": {}, "buffers": {}},
            "after_eval": {"inputs": {}, "params": {}, "buffers": {}}}
    first = [True]
    in_eval = [False]
    after_eval = [False]  # the training forward after the first eval

    def pre(path):
        def hook(mod, args):
            rec = (seen["eval"] if in_eval[0] else seen if first[0]
                   else seen["after_eval"] if after_eval[0] else None)
            if rec is not None:
                fl = [t.dtype for t in args if torch.is_tensor(t) and t.is_floating_point()]
                rec["inputs"].setdefault(path, str(fl[0]) if fl else None)
                for n, p in mod.named_parameters(recurse=False):
                    rec["params"].setdefault(path + "." + n if path else n, str(p.dtype))
                for n, b in mod.named_buffers(recurse=False):
                    rec["buffers"].setdefault(path + "." + n if path else n, str(b.dtype))
        return hook

    def post(path):
        def hook(mod, args, out):
            if first[0] and torch.is_tensor(out):
                seen["outputs"].setdefault(path, str(out.dtype))
        return hook

    handles = [m.register_forward_pre_hook(pre(p)) for p, m in module.named_modules()]
    handles += [m.register_forward_hook(post(p)) for p, m in module.named_modules()]
    for fqn, p in module.named_parameters():
        if p.requires_grad:
            handles.append(p.register_hook(
                lambda g, fqn=fqn: seen["grads"].setdefault(fqn, str(g.dtype)) and None))
    gathers = [0]
    unshard = model.worker.unshard

    def counting_unshard(unit):
        gathers[0] += 1
        return unshard(unit)

    model.worker.unshard = counting_unshard
    try:
        steps = train(a, name, model, module, seen, first, in_eval, after_eval)
    except Exception as e:  # the job fails with the error, as a training loop would report it
        model.finish("rank %d: %s" % (model.rank, e))
        raise
    for h in handles:
        h.remove()
    memory = model.worker.memory()  # (before full_parameters' gathers)
    params = {k: v if v.dtype == torch.float64 else v.float()
              for k, v in model.full_parameters().items()}
    torch.save({"rank": model.rank, "dp_rank": model.dp_rank, "steps": steps, "params": params,
                "gathers": gathers[0], "memory": memory,
                "seen": seen, "job_id": model.worker.job_id}, a.out)
    model.finish()
    return 0


def train(a, name, model, module, seen, first, in_eval, after_eval):
    rows = model.micro_batch_size
    r = model.dp_rank
    steps = []
    if cases.CASES[a.case].get("eval_train"):
        model.eval()  # every forward/backward in eval mode (training.eval_backward)
    for step in range(model.total_steps):
        losses = []
        for mb in range(model.micro_batches):
            inputs, target = cases.batch(name, step, mb, rows * model.dp_size)
            mine = tuple(t[r * rows:(r + 1) * rows] for t in inputs)
            if cases.data_dtype(a.case):
                mine = tuple(t.to(cases.data_dtype(a.case)) if t.is_floating_point() else t
                             for t in mine)
            last = mb + 1 == model.micro_batches
            with contextlib.nullcontext() if last else model.no_sync():
                out = model(*mine)
                tgt = target[r * rows:(r + 1) * rows]
                if cases.CASES[a.case]["split_loss"]:
                    l1, l2 = cases.split_losses(name, out, tgt)
                    model.backward(l1, retain_graph=True)
                    model.backward(l2)
                    loss = l1 + l2
                else:
                    loss = cases.loss_fn(name, out, tgt)
                    model.backward(loss)
            losses.append(loss.item())
            after_eval[0] = False
            if step == 0 and last:  # the parameters after a synced backward
                for fqn, p in module.named_parameters():
                    seen["after_backward"][fqn] = [str(p.dtype), p.grad is None, p.numel()]
            first[0] = False
        res = model.step(sum(losses) / len(losses))
        steps.append({"loss": res.loss, "grad_norm": res.grad_norm, "skipped": res.skipped,
                      "local_loss": sum(losses) / len(losses)})
        if cases.CASES[a.case]["eval"]:
            inputs, target = cases.eval_batch(name, rows * model.dp_size)
            model.eval()
            in_eval[0] = True
            with torch.no_grad():
                out = model(*inputs)  # every rank evaluates the whole batch
            in_eval[0] = False
            after_eval[0] = step == 0
            model.train()
            steps[-1]["eval_loss"] = cases.loss_fn(name, out, target).item()
    return steps


if __name__ == "__main__":
    sys.exit(main())
