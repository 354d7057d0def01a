"""The CPU twin's LayerNorm and GELU (kernels/src/nn_cpu.c) against PyTorch's, forward and backward.

The truth is torch in float64 on the same float32 inputs; the peer is torch in float32 (what a
PyTorch user gets). pcs must be within twice the peer's own error of the truth, or a few fp32
ulps of the tensor's scale where both are that close. Rows far from zero (mean 1e3, 1e4, std ~2)
are where a one-pass variance in fp32 would lose every digit; lengths below, at and above the
32 lanes with tails. GELU covers its negative tail, zero and large |x|.

Run: /usr/bin/python3 tests/python/test_nn_torch.py NN_PROBE [unittest args]
(NN_PROBE: the build's tests/nn_probe). Exit 77 without torch unless PCS_REQUIRE_TOOLS=1.
"""

import os
import subprocess
import sys
import unittest

try:
    import numpy as np
    import torch
except ImportError:  # Debian python3-torch, python3-numpy (deploy/install-deps.sh)
    print("test_nn_torch: torch or numpy is not installed")
    sys.exit(1 if os.environ.get("PCS_REQUIRE_TOOLS") == "1" else 77)

PROBE = None
ULP = 2.0 ** -23  # fp32 spacing at 1


def probe(args, *arrays):
    data = b"".join(np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in arrays)
    out = subprocess.run([PROBE] + [str(a) for a in args], input=data, capture_output=True,
                         timeout=60)
    if out.returncode != 0:
        raise AssertionError(f"nn_probe {args}: exit {out.returncode}: {out.stderr.decode()}")
    return np.frombuffer(out.stdout, dtype=np.float32).astype(np.float64)


class Close:
    """Collects, per tensor, pcs's and torch fp32's largest error against the fp64 truth,
    relative to the truth's largest magnitude."""

    def __init__(self, test, where):
        self.test, self.where = test, where

    def check(self, name, got, peer, truth, floor_ulps=8):
        scale = max(np.abs(truth).max(), 1e-30)
        e_pcs = np.abs(got - truth).max() / scale
        e_peer = np.abs(peer - truth).max() / scale
        bound = max(2.0 * e_peer, floor_ulps * ULP)
        self.test.assertLessEqual(
            e_pcs, bound, f"{self.where} {name}: pcs error {e_pcs:.3g}, torch fp32 {e_peer:.3g}")


class LayerNormTest(unittest.TestCase):
    def run_case(self, R, D, offset, seed):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(R, D, generator=g) * 1.7 + offset).float()
        dy = torch.randn(R, D, generator=g).float()
        w = (1 + 0.5 * torch.randn(D, generator=g)).float()
        b = (0.3 * torch.randn(D, generator=g)).float()
        out = probe(["layernorm", R, D], x.numpy(), dy.numpy(), w.numpy(), b.numpy())
        n = R * D
        self.assertEqual(out.size, 2 * n + 2 * D + 2 * R)
        got = [out[:n].reshape(R, D), out[n:2 * n].reshape(R, D), out[2 * n:2 * n + D],
               out[2 * n + D:2 * n + 2 * D]]
        save = out[2 * n + 2 * D:].reshape(R, 2)

        def torch_ln(dt):
            xx, ww, bb = (t.to(dt).requires_grad_() for t in (x, w, b))
            y = torch.nn.functional.layer_norm(xx, (D,), ww, bb, 1e-5)
            y.backward(dy.to(dt))
            return [t.detach().double().numpy() for t in (y, xx.grad, ww.grad, bb.grad)]

        truth, peer = torch_ln(torch.float64), torch_ln(torch.float32)
        c = Close(self, f"layernorm R={R} D={D} offset={offset:g}")
        for name, a, p, t in zip(("y", "dx", "dweight", "dbias"), got, peer, truth):
            c.check(name, a, p, t)
        # the saved statistics: torch's own (native_layer_norm) in fp64
        _, mean, rstd = torch.native_layer_norm(x.double(), (D,), None, None, 1e-5)
        mean, rstd = mean.reshape(R).numpy(), rstd.reshape(R).numpy()
        np.testing.assert_allclose(save[:, 1], rstd, rtol=1e-5, err_msg="1/std")
        np.testing.assert_allclose(save[:, 0], mean, rtol=4 * ULP, atol=4 * ULP,
                                   err_msg="mean")

    def test_rows_around_zero(self):
        for R, D in ((32, 1024), (32, 256), (3, 1), (5, 31), (5, 32), (5, 33), (8, 4099)):
            self.run_case(R, D, 0.0, seed=R * 7919 + D)

    def test_rows_far_from_zero(self):
        for offset in (1e3, 1e4):
            self.run_case(8, 1024, offset, seed=int(offset))
            self.run_case(4, 1031, -offset, seed=int(offset) + 1)


class GeluTest(unittest.TestCase):
    def test_forward_and_backward(self):
        g = torch.Generator().manual_seed(5)
        x = torch.cat([torch.randn(1 << 16, generator=g) * 3,
                       torch.linspace(-12, 12, 4097),  # both tails, 0 exactly
                       torch.tensor([-0.0, 1e-30, -1e-30, 88.0, -88.0])]).float()
        dy = torch.randn(x.numel(), generator=g).float()
        out = probe(["gelu", x.numel()], x.numpy(), dy.numpy())
        n = x.numel()

        def torch_gelu(dt):
            xx = x.to(dt).requires_grad_()
            y = torch.nn.functional.gelu(xx)
            y.backward(dy.to(dt))
            return [t.detach().double().numpy() for t in (y, xx.grad)]

        truth, peer = torch_gelu(torch.float64), torch_gelu(torch.float32)
        c = Close(self, "gelu")
        c.check("y", out[:n], peer[0], truth[0])
        c.check("dx", out[n:], peer[1], truth[1])


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_nn_torch.py NN_PROBE [unittest args]")
    PROBE = os.path.abspath(sys.argv.pop(1))
    unittest.main()
