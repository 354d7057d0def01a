"""pcs.torch end to end: the seeds' models trained through a real coordinator by two real
`python3 rank.py` processes (W = 2, dp_shard 2, full_shard), each compared with the same model
trained by plain PyTorch from the same weights and data.

- fp32: the reference is single-process PyTorch on the whole global batch (torch.optim.AdamW,
  clip_grad_norm_): parameters and losses must agree tightly (rtol 1e-4, atol 1e-5).
- bf16 / fp32 reduce (FSDP1 MixedPrecision): the reference runs each rank's rows in bf16 with
  the same casts (inputs at the root, BatchNorm upcast and back), reduces the gradients in fp32
  and steps fp32 masters; parameters within bf16's resolution (rtol 1e-2, atol 1e-3), losses
  rtol 1e-3; and the seeds' dtype assertions: every Linear's input and parameters bf16 in
  forward, gradients bf16, BatchNorm's parameters and input fp32.
- pure low precision (test_fsdp_pure_fp16's shape, with bf16: torch 1.13 has no fp16 matmul on
  the cpu): bf16 masters, parameters, inputs and gradients, one step, against the same step in
  plain PyTorch on bf16 parameters.

Run: /usr/bin/python3 tests/python/test_pcs_torch.py BUILD_DIR [unittest args]. The job is
submitted with `pcsctl submit` (the user story), the coordinator started on port 0.
"""

import copy
import json
import math
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SRC, "python"))

try:
    import torch
except ImportError:  # Debian python3-torch (deploy/install-deps.sh)
    print("test_pcs_torch: torch is not installed")
    sys.exit(1 if os.environ.get("PCS_REQUIRE_TOOLS") == "1" else 77)

import cases  # noqa: E402
import harness  # noqa: E402
import pcs.torch  # noqa: E402
from harness import Cluster  # noqa: E402

W = 2

# ---- references --------------------------------------------------------------------------------

def _optimizer(model, training):
    params = [p for p in model.parameters() if p.requires_grad]
    if "sgd" in training["optimizer"]:
        a = training["optimizer"]["sgd"]
        return torch.optim.SGD(params, lr=a["lr"], momentum=a["momentum"],
                               weight_decay=a["weight_decay"])
    a = training["optimizer"]["adamw"]
    return torch.optim.AdamW(params, lr=a["lr"], weight_decay=a["weight_decay"],
                             betas=(0.9, 0.999), eps=1e-8)


def reference_fp32(case_name, name, training, world, per_rank=False):
    """Plain single-process PyTorch on the global batch (and the held-out loss after each step
    for eval cases). `per_rank`: each micro-batch's forward and backward on one rank's rows at
    a time (the same gradient: the mean of the ranks' means), for models whose low-precision
    ops round differently with the batch size."""
    c = cases.CASES[case_name]
    model = cases.build(name)
    opt = _optimizer(model, training)
    M, rows = training["micro_batches"], training["micro_batch_size"] * world
    parts = world if per_rank else 1
    losses, evals = [], []
    for step in range(training["steps"]):
        opt.zero_grad()
        tot = 0.0
        for mb in range(M):
            inputs, target = cases.batch(name, step, mb, rows)
            n = rows // parts
            for r in range(parts):
                x = tuple(t[r * n:(r + 1) * n] for t in inputs)
                out = model(*x)
                tgt = target[r * n:(r + 1) * n]
                if c["split_loss"]:
                    loss = sum(cases.split_losses(name, out, tgt))
                else:
                    loss = cases.loss_fn(name, out, tgt)
                (loss / (M * parts)).backward()
                tot += loss.item() / parts
        if training.get("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), training["clip_grad_norm"])
        opt.step()
        losses.append(tot / M)
        if c["eval"]:
            inputs, target = cases.eval_batch(name, rows)
            with torch.no_grad():
                evals.append(cases.loss_fn(name, model(*inputs), target).item())
    return {k: v.detach().clone() for k, v in model.named_parameters()}, losses, evals


def _cast_out(dtype):
    return lambda _m, _args, out: out.to(dtype) if out.is_floating_point() else out


def _low_copy(master, dtype, wrap, output_dtype=None):
    """The rank's compute copy: parameters and buffers in `dtype` except BatchNorm's (an
    ignored class: full precision), which upcasts its input and casts its output back; the root
    and every wrapped module (a unit: cast_forward_inputs) cast their floating inputs to
    `dtype`."""
    m = copy.deepcopy(master)
    for path in wrap:
        m.get_submodule(path).register_forward_pre_hook(lambda _m, args: tuple(
            a.to(dtype) if a.is_floating_point() else a for a in args))
        if output_dtype:
            m.get_submodule(path).register_forward_hook(_cast_out(output_dtype))
    if output_dtype:
        m.register_forward_hook(_cast_out(output_dtype))
    for mod in m.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            def pre(_m, args):
                _m._in = args[0].dtype
                return tuple(a.float() for a in args)

            def post(_m, _args, out):
                return out.to(_m._in)
            mod.register_forward_pre_hook(pre)
            mod.register_forward_hook(post)
            continue
        for n, p in list(mod._parameters.items()):
            if p is not None:
                p.data = p.data.to(dtype)
        for n, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point():
                mod._buffers[n] = b.to(dtype)
    m.register_forward_pre_hook(lambda _m, args: tuple(
        a.to(dtype) if a.is_floating_point() else a for a in args))
    return m


def _full_eval(master, name, rows, buffer_dtype):
    """FSDP_USE_FULL_PREC_IN_EVAL on the masters: fp32, buffers holding their buffer_dtype values
    (pcs, like FSDP, keeps them in buffer_dtype and casts them back for eval)."""
    m = copy.deepcopy(master).float()
    for mod in m.modules():
        for n, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point() and buffer_dtype is not None:
                mod._buffers[n] = b.to(buffer_dtype).float()
    inputs, target = cases.eval_batch(name, rows)
    m.eval()
    with torch.no_grad():
        return cases.loss_fn(name, m(*inputs), target).item()


def reference_mixed(name, training, world, dtype, master_dtype=torch.float32,
                    output_dtype=None, buffer_dtype=None):
    wrap = cases.MODELS[name].WRAP
    """Each rank's rows computed in `dtype` from the masters, gradients reduced in fp32 (mean
    over ranks, summed over micro-batches), AdamW on the masters."""
    master = cases.build(name)
    if master_dtype != torch.float32:
        master = master.to(master_dtype)
    opt = _optimizer(master, training)
    M, rows = training["micro_batches"], training["micro_batch_size"]
    losses, evals = [], []
    for step in range(training["steps"]):
        acc = {k: torch.zeros(p.shape) for k, p in master.named_parameters()}
        tot = 0.0
        for mb in range(M):
            inputs, target = cases.batch(name, step, mb, rows * world)
            for r in range(world):
                m = _low_copy(master, dtype, wrap, output_dtype)
                loss = cases.loss_fn(name, m(*(t[r * rows:(r + 1) * rows] for t in inputs)),
                                     target[r * rows:(r + 1) * rows])
                (loss / M).backward()
                tot += loss.item() / world
                for k, p in m.named_parameters():
                    if p.grad is not None:
                        acc[k] += p.grad.float() / world
        for k, p in master.named_parameters():
            p.grad = acc[k].to(p.dtype)
        if training.get("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(master.parameters(), training["clip_grad_norm"])
        opt.step()
        losses.append(tot / M)
        if training.get("full_precision_eval"):
            evals.append(_full_eval(master, name, rows * world, buffer_dtype))
    return ({k: v.detach().float().clone() for k, v in master.named_parameters()}, losses,
            evals)


_DT = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16,
       "fp16": torch.float16}


def reference_per_rank(case_name, name, training, world):
    """FSDP1's arithmetic, rank by rank, in plain PyTorch (the fp64-master rows): each rank's rows
    computed in the param dtype from the masters (inputs in the model's dtype, cast as the
    units cast them), each rank's micro-batch gradients accumulated in the reduce dtype (the
    no-sync accumulator), pre-divided by the world (FSDP's predivide factor 2 for 2 ranks) and
    summed in the reduce dtype, cast to the master dtype, the optimizer on the masters."""
    c = cases.CASES[case_name]
    prec = c["precision"]
    mdt = _DT[prec.get("master_dtype", "fp32")]
    pdt = _DT[prec.get("param_dtype", prec.get("master_dtype", "fp32"))]
    rdt = _DT[prec.get("reduce_dtype", prec.get("param_dtype", prec.get("master_dtype", "fp32")))]
    master = cases.build_case(case_name)
    opt = _optimizer(master, training)
    M, rows = training["micro_batches"], training["micro_batch_size"]
    losses = []
    for step in range(training["steps"]):
        acc = [dict() for _ in range(world)]
        tot = 0.0
        for mb in range(M):
            inputs, target = cases.batch(name, step, mb, rows * world)
            for r in range(world):
                m = (_low_copy(master, pdt, cases.MODELS[name].WRAP) if pdt != mdt
                     else copy.deepcopy(master))
                x = tuple(t[r * rows:(r + 1) * rows].to(c["data"]) if t.is_floating_point()
                          else t[r * rows:(r + 1) * rows] for t in inputs)
                loss = cases.loss_fn(name, m(*x), target[r * rows:(r + 1) * rows])
                (loss / M).backward()
                tot += loss.item() / world
                for k, p in m.named_parameters():
                    if k not in acc[r]:  # spec §4.1 step 7: g.to(reduce_dtype), then += g
                        acc[r][k] = p.grad.to(rdt)
                    else:
                        acc[r][k] += p.grad
        for k, p in master.named_parameters():
            s = None
            for r in range(world):
                part = acc[r][k] / world
                s = part if s is None else s + part
            p.grad = s.to(mdt)
        opt.step()
        losses.append(tot / M)
    return {k: v.detach().clone() for k, v in master.named_parameters()}, losses


def reference_ignored(case_name, name, training, world):
    """FSDP2 ignored_params in plain PyTorch: one model per rank from the same weights, each on
    its rows; the managed parameters' gradients averaged over the ranks, the ignored ones each
    rank's own (never reduced), every rank's optimizer stepping its copy. Returns every rank's
    parameters and the mean losses."""
    ign = set(cases.CASES[case_name]["ignored"])
    models = [cases.build_case(case_name) for _ in range(world)]
    opts = [_optimizer(m, training) for m in models]
    M, rows = training["micro_batches"], training["micro_batch_size"]
    losses = []
    for step in range(training["steps"]):
        tot = 0.0
        for mb in range(M):
            inputs, target = cases.batch(name, step, mb, rows * world)
            for r, m in enumerate(models):
                x = tuple(t[r * rows:(r + 1) * rows] for t in inputs)
                loss = cases.loss_fn(name, m(*x), target[r * rows:(r + 1) * rows])
                (loss / M).backward()
                tot += loss.item() / world
        named = [dict(m.named_parameters()) for m in models]
        for k in named[0]:
            if k in ign:
                continue
            avg = sum(n[k].grad for n in named) / world
            for n in named:
                n[k].grad = avg.clone()
        for o in opts:
            o.step()
            o.zero_grad()
        losses.append(tot / M)
    return [{k: v.detach().clone() for k, v in m.named_parameters()} for m in models], losses


# ---- the tests ---------------------------------------------------------------------------------

class PcsTorchTest(unittest.TestCase):
    maxDiff = None

    def run_case(self, case_name):
        name, spec = cases.job(case_name)
        full = pcs.torch.job_spec(cases.build_case(case_name), **spec)
        self.assertEqual(full["program"], "pcs.torch")
        c = Cluster()
        ok = False
        try:
            outs = c.start_ranks(case_name, W)
            job = c.submit(full)
            codes = c.wait_ranks()
            self.assertEqual(codes, [0] * W, "ranks failed:\n" + c.logs())
            st = c.pcsctl("--json", "status", job["jobId"])
            self.assertEqual(st.returncode, 0, st.stderr)
            state = json.loads(st.stdout)
            self.assertIn("SUCCEEDED", json.dumps(state), state)
            res = [torch.load(o) for o in outs]
            for r in res:  # the plan's memory estimate is a promise
                m = r["memory"]
                self.assertLessEqual(m["peak_bytes"], m["promised_bytes"],
                                     "rank %d: runtime memory %s" % (r["rank"], m))
            ok = True
            return name, spec["training"], res
        finally:
            c.stop(keep=not ok)

    def assert_params(self, got, want, rtol, atol):
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            self.assertTrue(torch.allclose(got[k], want[k], rtol=rtol, atol=atol),
                            "%s: max |diff| %g" % (k, (got[k] - want[k]).abs().max()))

    def check_fp32(self, case_name):
        name, training, res = self.run_case(case_name)
        want, losses, evals = reference_fp32(case_name, name, training, W)
        for r in res:  # every rank sees the same parameters
            self.assert_params(r["params"], want, 1e-4, 1e-5)
            got = [s["loss"] for s in r["steps"]]
            self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(losses), rtol=1e-5),
                            "losses %s, reference %s" % (got, losses))
            if evals:
                got = [s["eval_loss"] for s in r["steps"]]
                self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(evals),
                                               rtol=1e-5),
                                "eval losses %s, reference %s" % (got, evals))
            for fqn, dt in r["seen"]["params"].items():
                self.assertEqual(dt, "torch.float32", fqn)
        return name, res

    def test_nested_wrapped_module_fp32(self):
        self.check_fp32("nested_fp32")

    def test_tied_embedding_fp32(self):
        name, res = self.check_fp32("tied_fp32")
        # one tensor, declared shared: the plan has embed.weight only, and the head sees it
        self.assertNotIn("head.weight", res[0]["params"])

    def test_per_param_layout_fp32(self):
        """FSDP2's layout: each rank holds rows (and, placed on dim 1, columns) of every
        parameter; pcs.torch binds the same flat buffer, so PyTorch's numbers come out."""
        self.check_fp32("tied_fp32_per_param")
        self.check_fp32("nested_fp32_per_param")

    def test_eval_mode_backward_in_full_precision(self):
        """training.eval_backward: a bf16-compute job and an fp16-reduce job trained entirely
        through eval-mode backwards compute and reduce in fp32 (FSDP1's full precision in
        eval), so they match plain fp32 PyTorch at fp32 tolerances."""
        self.check_fp32("nested_evalbwd_bf16")
        self.check_fp32("nested_evalbwd_fp16_reduce")

    def test_two_backward_calls_per_micro_batch_fp32(self):
        self.check_fp32("split_fp32")

    def test_frozen_and_trainable_in_one_unit_fp32(self):
        # flat, then FSDP2's per-parameter layout (the frozen rows of every rank's shard)
        for case in ("lora_fp32", "lora_fp32_per_param"):
            name, res = self.check_fp32(case)
            init = dict(cases.build(name).named_parameters())
            self.assertTrue(torch.equal(res[0]["params"]["adapter.base.weight"],
                                        init["adapter.base.weight"].detach()))
            self.assertFalse(torch.equal(res[0]["params"]["adapter.a.weight"],
                                         init["adapter.a.weight"].detach()))

    def test_activation_checkpointing_fp32(self):
        self.check_fp32("ckpt_fp32")

    def test_keep_gathered_accumulation_fp32(self):
        """training.accumulation keep_gathered: the same numbers, and the three resharding units
        are gathered once per step in forward and once more for the synced backward, instead of
        twice in each of the 3 micro-batches; the root (freed after each backward, as FSDP's
        FULL_SHARD root) in each micro-batch. Per step 3 + 3 + 3 instead of 3 + 9 + 9, for 4
        steps, plus full_parameters' 4 gathers at the end."""
        name, res = self.check_fp32("keep_fp32")
        self.assertEqual(res[0]["gathers"], 4 * (3 + 3 + 3) + 4)

    def test_external_input_fp32(self):
        self.check_fp32("external_fp32")

    def test_own_cast_fp32(self):
        self.check_fp32("owncast_fp32")

    def test_frozen_submodule_fp32(self):
        name, res = self.check_fp32("frozen_fp32")
        init = dict(cases.build(name).named_parameters())
        for k in ("frozen.weight", "frozen.bias"):
            self.assertTrue(torch.equal(res[0]["params"][k], init[k].detach()), k)
        self.assertFalse(torch.equal(res[0]["params"]["trained.weight"],
                                     init["trained.weight"].detach()))

    def check_mixed(self, case_name, dtype, master=torch.float32, output_dtype=None,
                    buffer_dtype=None):
        name, training, res = self.run_case(case_name)
        want, losses, evals = reference_mixed(name, training, W, dtype, master, output_dtype,
                                              buffer_dtype)
        for r in res:
            self.assert_params(r["params"], {k: v.to(dtype).float() for k, v in want.items()},
                               1e-2, 1e-3)
            got = [s["loss"] for s in r["steps"]]
            self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(losses), rtol=1e-3),
                            "losses %s, reference %s" % (got, losses))
            if evals:  # fp32 eval on masters that agree within the bf16 steps' rounding
                got = [s["eval_loss"] for s in r["steps"]]
                self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(evals),
                                               rtol=1e-3),
                                "eval losses %s, reference %s" % (got, evals))
        return res

    def test_nested_wrapped_module_bf16_params_fp32_reduce(self):
        res = self.check_mixed("nested_bf16", torch.bfloat16)
        seen = res[0]["seen"]
        for path in ("module.0", "module.1.0", "module.1.1", "module.2", "module.3"):
            self.assertEqual(seen["inputs"][path], "torch.bfloat16", path)
            self.assertEqual(seen["params"][path + ".weight"], "torch.bfloat16", path)
            self.assertEqual(seen["grads"][path + ".weight"], "torch.bfloat16", path)
            self.assertEqual(seen["after_backward"][path + ".weight"][:2],
                             ["torch.float32", True], path)

    def test_unit_called_twice_under_bf16(self):
        res = self.check_mixed("twice_bf16", torch.bfloat16)
        self.assertEqual(res[0]["seen"]["after_backward"]["shared.weight"][:2],
                         ["torch.float32", True])

    def test_output_dtype_fp32_under_bf16(self):
        res = self.check_mixed("external_bf16_out32", torch.bfloat16, output_dtype=torch.float32)
        seen = res[0]["seen"]
        for unit in ("a", "b", ""):  # every unit's output, the root's included
            self.assertEqual(seen["outputs"][unit], "torch.float32", unit)
        self.assertEqual(seen["inputs"]["b"], "torch.bfloat16")  # cast again at the next unit
        self.assertEqual(seen["params"]["b.weight"], "torch.bfloat16")

    def test_full_precision_eval_restores_buffer_dtypes(self):
        """test_full_precision_in_eval_buffers: eval in fp32 (parameters, inputs, buffers),
        training in bf16 with the buffer in buffer_dtype again."""
        res = self.check_mixed("owncast_bf16_fulleval", torch.bfloat16,
                               buffer_dtype=torch.bfloat16)
        seen = res[0]["seen"]
        ev = seen["eval"]
        self.assertEqual(ev["buffers"]["inner.shift"], "torch.float32")
        self.assertEqual(ev["params"]["inner.weight"], "torch.float32")
        self.assertEqual(ev["inputs"]["inner"], "torch.float32")  # no cast in eval
        self.assertEqual(seen["buffers"]["inner.shift"], "torch.bfloat16")
        self.assertEqual(seen["params"]["inner.weight"], "torch.bfloat16")
        # and back to buffer_dtype for the next training forward
        self.assertEqual(seen["after_eval"]["buffers"]["inner.shift"], "torch.bfloat16")
        self.assertEqual(seen["after_eval"]["params"]["inner.weight"], "torch.bfloat16")

    def test_own_cast_and_buffer_under_bf16(self):
        res = self.check_mixed("owncast_bf16", torch.bfloat16)
        seen = res[0]["seen"]
        self.assertEqual(seen["buffers"]["inner.shift"], "torch.bfloat16")  # buffer_dtype
        self.assertEqual(seen["inputs"]["inner"], "torch.bfloat16")
        # the module's own float() is undone by the next unit's input cast
        self.assertEqual(seen["inputs"]["out"], "torch.bfloat16")
        # after a synced backward the parameters are back in the master dtype, gradients in pcs
        for fqn in ("inner.weight", "out.weight"):
            self.assertEqual(seen["after_backward"][fqn][:2], ["torch.float32", True], fqn)

    def test_batchnorm_full_precision_under_bf16(self):
        res = self.check_mixed("batchnorm_bf16", torch.bfloat16)
        seen = res[0]["seen"]
        self.assertEqual(seen["inputs"]["fc1"], "torch.bfloat16")
        self.assertEqual(seen["params"]["fc1.weight"], "torch.bfloat16")
        self.assertEqual(seen["inputs"]["fc2"], "torch.bfloat16")  # BatchNorm cast it back
        self.assertEqual(seen["inputs"]["bn"], "torch.float32")
        self.assertEqual(seen["params"]["bn.weight"], "torch.float32")
        self.assertEqual(seen["grads"]["bn.weight"], "torch.float32")

    def test_nested_wrapped_module_pure_bf16(self):
        res = self.check_mixed("nested_pure_bf16", torch.bfloat16, torch.bfloat16)
        seen = res[0]["seen"]
        for path in ("module.0", "module.1.0", "module.3"):
            self.assertEqual(seen["inputs"][path], "torch.bfloat16", path)
            self.assertEqual(seen["params"][path + ".weight"], "torch.bfloat16", path)
            self.assertEqual(seen["grads"][path + ".weight"], "torch.bfloat16", path)
        self.assertTrue(all(s["loss"] == s["loss"] for s in res[0]["steps"]))  # not NaN


    def check_fp64(self, case_name, rtol, atol):
        """An fp64-master row of test_fsdp_mixed_precision: pcs against reference_per_rank, and
        the seed's dtype assertions (parameters and inputs in the param dtype inside forward,
        the master dtype float64 outside it, pcs holding the gradients)."""
        name, training, res = self.run_case(case_name)
        want, losses = reference_per_rank(case_name, name, training, W)
        for r in res:
            for k, v in r["params"].items():
                self.assertEqual(v.dtype, torch.float64, k)
            self.assert_params(r["params"], want, rtol, atol)
            # (the step report's loss is the dp mean taken in fp32: fp32's resolution)
            got = [s["loss"] for s in r["steps"]]
            self.assertTrue(torch.allclose(torch.tensor(got, dtype=torch.float64),
                                           torch.tensor(losses, dtype=torch.float64),
                                           rtol=3e-7, atol=0),
                            "losses %s, reference %s" % (got, losses))
        return res[0]["seen"]

    def assert_seen_fp64(self, seen, compute):
        """The seed's dtype checks: inputs, parameters and their gradients in the compute dtype
        inside forward and backward, the master dtype float64 after it (pcs holds the
        gradients)."""
        for path in ("module.0", "module.1.0", "module.3"):
            self.assertEqual(seen["inputs"][path], compute, path)
            self.assertEqual(seen["params"][path + ".weight"], compute, path)
            self.assertEqual(seen["grads"][path + ".weight"], compute, path)
            self.assertEqual(seen["after_backward"][path + ".weight"][:2],
                             ["torch.float64", True], path)

    def test_fp64_masters_no_mixed_precision(self):
        """full_precision_param_dtype=float64, mp_no_mixed_precision: fp64 compute, fp64
        reductions, fp64 AdamW. Tight: an fp32 step anywhere misses by ~1e-8."""
        self.assert_seen_fp64(self.check_fp64("nested_fp64", 1e-10, 1e-13), "torch.float64")

    def test_fp64_masters_fp16_reduce(self):
        """mp_only_reduce with float64 parameters: compute in fp64, the no-sync micro-batches'
        gradients accumulated in fp16 (FSDP2: g.to(reduce_dtype), then acc += g in place),
        reduced in fp16 (pre-divided, summed in fp16) and cast back to fp64 for the update."""
        self.assert_seen_fp64(self.check_fp64("nested_fp64_fp16_reduce", 1e-10, 1e-13),
                              "torch.float64")

    def test_fp64_masters_bf16_params_fp32_reduce(self):
        """The default_mp row with float64 parameters (bf16 for fp16: no fp16 matmul on the
        cpu): bf16 compute from the fp64 masters, fp32 reductions, fp64 masters outside forward
        and backward."""
        self.assert_seen_fp64(self.check_fp64("nested_fp64_bf16", 1e-10, 1e-13),
                              "torch.bfloat16")


    def test_ignored_params_stay_whole_uncast_and_unreduced(self):
        """FSDP2 ignored_params: module.2.bias (its Linear a unit of its own) and
        module.0.weight (in the root unit) are whole on every rank and stepped with each rank's
        own gradient: the ranks' copies differ, each is PyTorch's per-rank training, and the
        managed parameters agree on every rank."""
        name, training, res = self.run_case("nested_ignored_fp32")
        want, losses = reference_ignored("nested_ignored_fp32", name, training, W)
        ign = cases.CASES["nested_ignored_fp32"]["ignored"]
        by_rank = {r["dp_rank"]: r for r in res}
        for dp, r in by_rank.items():
            self.assert_params(r["params"], want[dp], 1e-5, 1e-6)
            got = [s["loss"] for s in r["steps"]]
            self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(losses), rtol=1e-5),
                            "losses %s, reference %s" % (got, losses))
        for k in ign:
            self.assertFalse(torch.equal(by_rank[0]["params"][k], by_rank[1]["params"][k]), k)
        self.assertTrue(torch.equal(by_rank[0]["params"]["module.2.weight"],
                                    by_rank[1]["params"]["module.2.weight"]))

    def test_ignored_param_under_mixed_precision_fails_as_pytorch(self):
        """An ignored bias stays fp32 while its Linear computes in bf16: the forward fails
        with PyTorch's own error, and the job fails with it."""
        name, spec = cases.job("nested_ignored_bf16")
        c = Cluster()
        ok = False
        try:
            c.start_ranks("nested_ignored_bf16", W)
            job = c.submit(pcs.torch.job_spec(cases.build(name), **spec))
            codes = c.wait_ranks()
            self.assertTrue(all(x != 0 for x in codes), codes)
            st = json.loads(c.pcsctl("--json", "status", job["jobId"]).stdout)
            self.assertIn("FAILED", json.dumps(st), st)
            self.assertIn("must have the same dtype", json.dumps(st), st)
            ok = True
        finally:
            c.stop(keep=not ok)


    def test_mixed_dtype_group_frozen_bf16_base_fp32_adapters(self):
        """A group of mixed dtypes (FSDP2 gathers it as uint8): the adapter unit holds a frozen
        bf16 base Linear and fp32 adapters, sharded per parameter, no mixed precision. The
        base computes in bf16 and stays bit for bit what it was, the adapters and the rest
        train as plain single-process PyTorch does (rank by rank: a bf16 matmul rounds
        differently with the number of rows). Fully sharded, and replicated (no_shard: the
        frozen bf16 unit computes on its master shard, the fp32 one all-reduces)."""
        for case in ("lora_bf16base_per_param", "lora_bf16base_no_shard"):
            self.check_lora_bf16base(case)

    def check_lora_bf16base(self, case):
        name, training, res = self.run_case(case)
        want, losses, _ = reference_fp32(case, name, training, W, per_rank=True)
        init = dict(cases.build(name).named_parameters())
        for r in res:
            self.assert_params(r["params"], {k: v.float() for k, v in want.items()}, 1e-4, 1e-5)
            for k in ("adapter.base.weight", "adapter.base.bias"):
                self.assertTrue(torch.equal(r["params"][k], init[k].detach().float()), k)
            got = [s["loss"] for s in r["steps"]]
            self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(losses), rtol=1e-5),
                            "losses %s, reference %s" % (got, losses))
            seen = r["seen"]
            self.assertEqual(seen["params"]["adapter.base.weight"], "torch.bfloat16")
            self.assertEqual(seen["params"]["adapter.a.weight"], "torch.float32")
            self.assertEqual(seen["inputs"]["adapter"], "torch.float32")  # no cast
            self.assertEqual(seen["outputs"]["adapter"], "torch.float32")
            self.assertEqual(seen["grads"]["adapter.b.weight"], "torch.float32")
        self.assertFalse(torch.equal(res[0]["params"]["adapter.a.weight"],
                                     init["adapter.a.weight"].detach()))

    def test_native_bf16_blocks_hand_on_bf16(self):
        """Units of bf16 parameters in an fp32 model with no policy: l0's bf16 output goes to
        l1 uncast (a cast to fp32 there would fail l1's matmul), and the model trains as
        PyTorch does rank by rank."""
        name, training, res = self.run_case("bf16blocks_fp32")
        want, losses, _ = reference_fp32("bf16blocks_fp32", name, training, W, per_rank=True)
        for r in res:
            self.assert_params(r["params"], {k: v.float() for k, v in want.items()}, 1e-4, 1e-5)
            got = [s["loss"] for s in r["steps"]]
            self.assertTrue(torch.allclose(torch.tensor(got), torch.tensor(losses), rtol=1e-5),
                            "losses %s, reference %s" % (got, losses))
            self.assertEqual(r["seen"]["outputs"]["l0"], "torch.bfloat16")
            self.assertEqual(r["seen"]["inputs"]["l1"], "torch.bfloat16")

    def test_mixed_dtype_group_with_two_trainable_dtypes_is_refused(self):
        """The base trained too: FSDP2 refuses a group whose trainable parameters differ in
        dtype ("FSDP expects uniform original parameter dtype", whatever the policy), and so
        does pcs, at SubmitJob, naming the unit and both parameters."""
        name, spec = cases.job("lora_bf16base_trained_bf16")
        c = Cluster()
        try:
            path = os.path.join(c.dir, "job.json")
            with open(path, "w") as f:
                json.dump(pcs.torch.job_spec(cases.build(name), **spec), f)
            r = c.pcsctl("submit", path)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("unit 'adapter' trains bf16 and fp32 parameters "
                          "('adapter.base.weight', 'adapter.a.weight')", r.stderr)
            self.assertIn("FSDP expects uniform original parameter dtype", r.stderr)
        finally:
            c.stop()


CAST_RANK = r'''
import json, sys
import torch
sys.path.insert(0, sys.argv[3])
from pcs import worker as pw
vals = torch.tensor(json.loads(sys.argv[4]), dtype=torch.float64)
w = pw.Worker(sys.argv[1], identity=sys.argv[2], join_timeout_ms=60000, program="pcs.cast-test",
              init64=lambda fqn, first, n: vals[first:first + n].contiguous())
out = {}
w.begin_step()
for u in w.units:
    if not u.n_params:
        continue
    t = w.unshard(u.index).torch()
    words = t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)
    out[u.path] = [t.dtype.__repr__(), words[:len(vals)].tolist()]
    w.reshard(u.index)
    w.grad_buffer(u.index).torch().zero_()
    w.hand_in_grads(u.index, True)
w.step(0.0)
w.finish()
w.destroy()
print(json.dumps(out))
'''


def _cast_edges():
    """float64 values where rounding straight to the narrow dtype and rounding through fp32
    first (c10's rule: a double becomes BFloat16 / Half through float) differ: a hair above a
    tie of the narrow dtype, which fp32 rounds onto the tie; with ties on even and odd
    neighbours, both signs, fp16 subnormals and overflow, fp32 overflow, and plain values."""
    v = []
    tiny = 2.0 ** -40  # far below half an fp32 ulp of values near 1
    for m in (1.0, 1.5, 1.0078125, 3.140625, 0.0001220703125, 1000.0):
        for sign in (1.0, -1.0):
            for ulp in (2.0 ** -7, 2.0 ** -10):  # bf16 and fp16 ulp at 1
                e = math.frexp(m)[1] - 1
                tie = m + ulp * 2.0 ** e / 2  # halfway to the next narrow value
                v += [sign * (tie + tiny * 2.0 ** e), sign * (tie - tiny * 2.0 ** e)]
                tie = m + 3 * ulp * 2.0 ** e / 2  # halfway from an odd neighbour
                v += [sign * (tie + tiny * 2.0 ** e), sign * (tie - tiny * 2.0 ** e)]
    v += [65519.99999, 65520.000001, 3.0e-7 + 1e-20, 2.0 ** -25 + 2.0 ** -60, 4.0e38, -4.0e38,
          -0.0, 1e-300, 0.1, -2.718281828459045, 123456.789]
    return v


class CastTest(unittest.TestCase):
    def test_fp64_master_casts_are_torchs(self):
        """fp64 masters cast to the compute dtype at unshard (issue 15: casts fp64 to
        fp32/bf16/fp16 bit-exact with PyTorch's): units computing in bf16, fp16 and fp32 from the
        same float64 values, each word compared with torch's .to() of them. The values sit where
        rounding straight from float64 differs from rounding through fp32 (numpy's direct
        float64 -> float16 differs on some of them: the test can tell the two apart)."""
        import numpy as np
        vals = _cast_edges()
        ref = torch.tensor(vals, dtype=torch.float64)
        with np.errstate(over="ignore"):
            direct = torch.from_numpy(np.array(vals, dtype=np.float64).astype(np.float16))
        self.assertFalse(torch.equal(direct.view(torch.int16), ref.to(torch.float16)
                                     .view(torch.int16)))
        job = {
            "name": "cast-probe", "program": "pcs.cast-test",
            "model": {"explicit": {"modules": [{"path": "", "class": "Probe"}] + [
                {"path": p, "class": "Linear", "params": [{"name": "w", "shape": [len(vals)]}]}
                for p in ("a", "b", "c")]}},
            "wrap": {"explicit": {"paths": ["a", "b", "c"]}},
            "precision": {"master_dtype": "fp64", "param_dtype": "bf16",
                          "overrides": [{"match": {"path": "b"}, "param_dtype": "fp16"},
                                        {"match": {"path": "c"}, "param_dtype": "fp32"}]},
            "strategy": "full_shard", "mesh": [{"dim": "dp_shard", "size": 1}],
            "training": {"steps": 1, "micro_batch_size": 1, "micro_batches": 1,
                         "optimizer": {"sgd": {"lr": 0.1}}},
        }
        c = Cluster()
        ok = False
        p = None
        try:
            p = subprocess.Popen([sys.executable, "-c", CAST_RANK, c.addr, "cast-0",
                                  os.path.join(SRC, "python"), json.dumps(vals)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=c.env())
            c.submit(job)
            so, se = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, se)
            got = json.loads(so.strip().splitlines()[-1])
            for path, dt, view in (("a", torch.bfloat16, torch.int16),
                                   ("b", torch.float16, torch.int16),
                                   ("c", torch.float32, torch.int32)):
                self.assertEqual(got[path][0], repr(dt), path)
                want = ref.to(dt).view(view).tolist()
                bad = [(vals[i], got[path][1][i], want[i]) for i in range(len(vals))
                       if got[path][1][i] != want[i]]
                self.assertEqual(bad, [], "%s: (value, pcs word, torch word)" % dt)
            ok = True
        finally:
            if p is not None:
                p.kill()
            c.stop(keep=not ok)


class ProgramRoutingTest(unittest.TestCase):
    def test_job_for_pcs_torch_waits_for_a_pcs_torch_worker(self):
        """A job naming program pcs.torch is not given to pcs-worker processes."""
        c = Cluster()
        ok = False
        try:
            name, spec = cases.job("nested_fp32")
            log = open(os.path.join(c.dir, "pcs-worker.log"), "w")
            w = [subprocess.Popen([harness.binary("pcs-worker"), "--coordinator", c.addr,
                                   "--identity", "plain-%d" % i, "--max-jobs", "1"],
                                  stdout=log, stderr=subprocess.STDOUT) for i in range(W)]
            try:
                job = c.submit(pcs.torch.job_spec(cases.build(name), **spec))
                jid = job["jobId"]
                deadline = time.time() + 10
                while time.time() < deadline:
                    r = json.loads(c.pcsctl("--json", "workers").stdout or "{}")
                    if len(r.get("workers", [])) == W:
                        break
                    time.sleep(0.1)
                ws = json.loads(c.pcsctl("--json", "workers").stdout)["workers"]
                self.assertEqual(sorted(x.get("program") for x in ws), ["pcs-worker"] * W)
                time.sleep(1.5)  # several scheduling rounds
                st = json.loads(c.pcsctl("--json", "status", jid).stdout)
                self.assertIn("PENDING", json.dumps(st))
            finally:
                for p in w:
                    p.terminate()
                    p.wait(timeout=20)
                log.close()
            ok = True
        finally:
            c.stop(keep=not ok)


if __name__ == "__main__":
    harness.set_build(sys.argv.pop(1))
    torch.set_num_threads(1)
    unittest.main()
