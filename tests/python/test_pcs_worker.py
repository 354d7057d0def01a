"""pcs.worker, the C API one to one: two processes join a job (program "pcs.raw-test") through a
real coordinator and train a linear regression by hand with numpy on pcs's own buffers (no
copies): the plan as the API reports it (units, parameters, policy), unshard / grad buffer /
hand-in / step, the loss going down, every step reported, the runtime's memory within the
plan's promise; errors as PcsError with pcs's status
and message (a unit out of range, a bad program name, no job within the join timeout).

Run: /usr/bin/python3 tests/python/test_pcs_worker.py BUILD_DIR [unittest args].
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

try:
    import numpy as np
except ImportError:  # Debian python3-numpy (deploy/install-deps.sh)
    print("test_pcs_worker: numpy is not installed")
    sys.exit(1 if os.environ.get("PCS_REQUIRE_TOOLS") == "1" else 77)

import pcs  # noqa: E402
from pcs import worker as pw  # noqa: E402
from harness import Cluster, set_build  # noqa: E402

JOB = {
    "name": "raw-c-api", "program": "pcs.raw-test",
    "model": {"explicit": {"modules": [
        {"path": "", "class": "Regressor"},
        {"path": "fc", "class": "Linear",
         "params": [{"name": "weight", "shape": [4, 8]}, {"name": "bias", "shape": [4]}]}]}},
    "wrap": {"explicit": {"paths": ["fc"]}},
    "precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"},
    "strategy": "full_shard", "mesh": [{"dim": "dp_shard", "size": 2}],
    "training": {"steps": 25, "micro_batch_size": 16, "micro_batches": 2,
                 "optimizer": {"adamw": {"lr": 0.1}}},
}

RANK = r'''
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from pcs import worker as pw
out = {"errors": {}}
w = pw.Worker(sys.argv[1], identity=sys.argv[2], join_timeout_ms=60000, program="pcs.raw-test")
out.update(rank=w.rank, world=w.world_size, dp=[w.dp_rank, w.dp_size], job=w.job_id,
           steps=w.total_steps, mb=[w.micro_batches, w.micro_batch_size])
out["units"] = [[u.path, u.n_params, u.padded_numel, u.param_dtype, u.is_root] for u in w.units]
fc = [u.index for u in w.units if u.path == "fc"][0]
out["params"] = [[p.fqn, p.unit, p.offset, list(p.shape)] for p in w.params(fc)]
pol = w.unit_policy(fc)
out["policy"] = [pol.input_dtype, pol.reduce_dtype, pol.reshard_after_forward, pol.modules]
try:
    w.unshard(99)
except pw.PcsError as e:
    out["errors"]["unshard"] = [e.status, e.message]
Wt = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
def bf16(a):  # the bf16 words of float32 values (round to nearest even), and back
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
def f32(words):
    return (words.astype(np.uint32) << 16).view(np.float32)
wp, bp = (p for p in w.params(fc))
losses = []
for step in range(w.total_steps):
    w.begin_step()
    tot = 0.0
    for mb in range(w.micro_batches):
        rng = np.random.default_rng(1000 * step + mb)
        X = rng.standard_normal((w.micro_batch_size * w.dp_size, 8)).astype(np.float32)
        Y = X @ Wt.T + 0.5
        rows = slice(w.dp_rank * w.micro_batch_size, (w.dp_rank + 1) * w.micro_batch_size)
        X, Y = X[rows], Y[rows]
        buf = w.unshard(fc)
        flat = f32(buf.numpy())  # a view of pcs's memory, read as bf16 words
        Wm = flat[wp.offset:wp.offset + wp.numel].reshape(4, 8)
        b = flat[bp.offset:bp.offset + bp.numel]
        err = X @ Wm.T + b - Y
        tot += float((err ** 2).mean())
        g = w.grad_buffer(fc)
        gv = g.numpy()  # written in place: no copy back
        scale = 2.0 / err.size / w.micro_batches
        gv[wp.offset:wp.offset + wp.numel] = bf16((scale * err.T @ X).reshape(-1))
        gv[bp.offset:bp.offset + bp.numel] = bf16(scale * err.sum(0))
        out["grad_view"] = gv.__array_interface__["data"][0] == g.address  # no copy
        w.hand_in_grads(fc, sync=mb + 1 == w.micro_batches)
        w.reshard(fc)
    r = w.step(tot / w.micro_batches)
    losses.append(r.loss)
out["losses"] = losses
out["done"] = r.done
out["memory"] = w.memory()
w.finish()
w.destroy()
print(json.dumps(out))
'''


class WorkerApiTest(unittest.TestCase):
    def test_two_processes_train_through_the_c_api(self):
        c = Cluster()
        ok = False
        try:
            procs = [subprocess.Popen([sys.executable, "-c", RANK, c.addr, "raw-%d" % i,
                                       os.path.join(HERE, "..", "..", "python")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=c.env()) for i in range(2)]
            job = c.submit(JOB)
            outs = []
            for p in procs:
                so, se = p.communicate(timeout=120)
                self.assertEqual(p.returncode, 0, se)
                outs.append(json.loads(so.strip().splitlines()[-1]))
            self.assertEqual(sorted(o["rank"] for o in outs), [0, 1])
            for o in outs:
                self.assertEqual(o["world"], 2)
                self.assertEqual(o["job"], job["jobId"])
                self.assertEqual(o["steps"], 25)
                self.assertEqual(o["mb"], [2, 16])
                # the root (no parameters) and fc: 36 bf16 elements (the bias starts at 32, a
                # 16-byte boundary), 18 per rank
                self.assertEqual(o["units"][0][:2], ["", 0])
                self.assertEqual(o["units"][1][:2], ["fc", 2])
                self.assertEqual(o["units"][1][3], "bf16")
                self.assertEqual(o["units"][1][2], 36)  # 32 + 4, 16-byte aligned, / 2
                self.assertEqual(o["params"], [["fc.weight", 1, 0, [4, 8]],
                                               ["fc.bias", 1, 32, [4]]])
                self.assertEqual(o["policy"], ["bf16", "fp32", True, ["fc"]])
                self.assertEqual(o["errors"]["unshard"][0], "invalid_arg")
                self.assertIn("out of range", o["errors"]["unshard"][1])
                self.assertTrue(o["grad_view"])
                self.assertTrue(o["done"])
                self.assertLess(o["losses"][-1], 0.2 * o["losses"][0], o["losses"])
                # the plan's estimate is a promise: the shards, AdamW state, the gathered unit,
                # its gradient block and reduction input stay within it
                m = o["memory"]
                self.assertGreater(m["step_peak_bytes"], 0, m)
                self.assertLessEqual(m["peak_bytes"], m["promised_bytes"], m)
            self.assertEqual(outs[0]["losses"], outs[1]["losses"])  # the dp mean, on both ranks
            st = c.pcsctl("--json", "status", job["jobId"])
            self.assertIn("JOB_STATE_SUCCEEDED", st.stdout)
            ok = True
        finally:
            c.stop(keep=not ok)

    def test_errors_carry_the_status_and_message(self):
        c = Cluster()
        try:
            with self.assertRaises(pw.PcsError) as e:
                pw.Worker(c.addr, identity="bad", program="no spaces allowed")
            self.assertEqual(e.exception.status, "invalid_arg")
            self.assertIn("program", e.exception.message)
            with self.assertRaises(pw.PcsError) as e:
                pw.Worker(c.addr, identity="idle", join_timeout_ms=300, program="nobody")
            self.assertEqual(e.exception.status, "timeout")
        finally:
            c.stop()

    def test_device_buffers_expose_the_cuda_array_interface(self):
        b = pw.Buffer(0x7F0000001000, 10, pw.DTYPE_BF16, "cuda")
        self.assertEqual(b.nbytes, 20)
        self.assertEqual(b.__cuda_array_interface__,
                         {"shape": (10,), "typestr": "<u2", "data": (0x7F0000001000, False),
                          "version": 3, "strides": None})
        h = pw.Buffer(0x1000, 4, pw.DTYPE_FP32, "cpu")
        self.assertFalse(hasattr(h, "__cuda_array_interface__"))
        with self.assertRaises(ValueError):
            b.numpy()

    def test_the_package_imports_without_torch(self):
        self.assertEqual(pcs.__version__, "0.1.0")
        self.assertEqual(pw.dtype_name(pw.DTYPE_BF16), "bf16")
        self.assertTrue(os.path.exists(pcs.library_path()), pcs.library_path())


if __name__ == "__main__":
    set_build(sys.argv.pop(1))
    unittest.main()
