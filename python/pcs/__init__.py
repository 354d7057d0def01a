"""pcs: the Python side of the parameter coordination service.

Two layers over the worker C API (libpcs_worker.so, pcs/worker.h):

- ``pcs.worker``: the C API one to one (join, units, parameters, unshard, prefetch, reshard,
  gradient buffer, hand-in, step, finish, abort), buffers without copies, errors as
  :class:`PcsError` carrying pcs's message.
- ``pcs.torch``: puts an ``nn.Module`` on pcs: :func:`pcs.torch.model_spec` writes the job's
  explicit module tree, :func:`pcs.torch.shard` joins a job and drives the module's forward and
  backward through the plan (PyTorch does the math; pcs owns the fp32 shards, the collectives,
  mixed precision, the optimizer and the step reports).

The torch layer is imported on demand (``import pcs.torch``), so ``import pcs`` needs no torch.
"""

from .worker import PcsError, Worker, dtype_name, library_path

__version__ = "0.1.0"
__all__ = ["PcsError", "Worker", "dtype_name", "library_path", "__version__"]
