"""The pcs worker C API (pcs/worker.h) one to one, over ctypes.

A program joins a job through the coordinator (it registers like pcs-worker and receives its
rank and the plan); then, per step: unshard a unit (pcs all-gathers its parameters in the plan's
dtype into a flat buffer), compute, write the gradients into the unit's gradient buffer, hand
them in (reduce-scatter, or accumulate without sync), reshard, and step (grad scaler, clipping,
the optimizer on the fp32 shards, a step report to the coordinator).

Buffers come back as :class:`Buffer` objects over pcs's memory, without copies:
``buf.torch()`` (``torch.frombuffer`` on the cpu backend, ``__cuda_array_interface__`` on cuda),
``buf.numpy()``. They are valid until the unit is resharded (parameters) or handed in
(gradients). Errors raise :class:`PcsError` with pcs's status and message.

One thread drives a :class:`Worker`; :meth:`Worker.abort` may be called from any thread.
"""

import ctypes
import ctypes.util
import os

__all__ = ["PcsError", "Worker", "Buffer", "UnitInfo", "ParamInfo", "UnitPolicy", "StepResult",
           "dtype_name", "library_path"]

# pcs_status_t (pcs/status.h): the ones this package raises itself
PCS_OK, PCS_ERR_INVALID_ARG, PCS_ERR_STATE = 0, 1, 2

# pcs_dtype_t (pcs/dtype.h)
DTYPE_NONE, DTYPE_FP32, DTYPE_BF16, DTYPE_FP16, DTYPE_FP64, DTYPE_INT64 = range(6)
_DTYPE_NAMES = {DTYPE_NONE: "none", DTYPE_FP32: "fp32", DTYPE_BF16: "bf16", DTYPE_FP16: "fp16",
                DTYPE_FP64: "fp64", DTYPE_INT64: "int64"}
_DTYPE_SIZES = {DTYPE_FP32: 4, DTYPE_BF16: 2, DTYPE_FP16: 2, DTYPE_FP64: 8, DTYPE_INT64: 8}
# __cuda_array_interface__ / numpy type strings (bf16 has none: raw 16-bit words)
_TYPESTR = {DTYPE_FP32: "<f4", DTYPE_BF16: "<u2", DTYPE_FP16: "<f2", DTYPE_FP64: "<f8",
            DTYPE_INT64: "<i8"}


def dtype_name(dt):
    """pcs's name of a pcs_dtype_t value: fp32, bf16, fp16, fp64, int64, none."""
    return _DTYPE_NAMES.get(dt, "?")


class PcsError(RuntimeError):
    """A pcs call failed: ``status`` is pcs's status name (pcs_status_str: ``invalid_arg``,
    ``state``, ``timeout`` ...), ``code`` its number (pcs_status_t), the message pcs's own
    (pcs_last_error()) or this package's."""

    def __init__(self, code, status, message):
        super().__init__("%s: %s" % (status, message))
        self.code = code
        self.status = status
        self.message = message


# ---- the library ---------------------------------------------------------------------------------

def library_path():
    """Where libpcs_worker is loaded from: $PCS_WORKER_LIBRARY; the path `cmake --install`
    recorded next to the package; the build tree of a source checkout (build/lib); the
    dynamic linker's search (libpcs_worker.so.0)."""
    env = os.environ.get("PCS_WORKER_LIBRARY")
    if env:
        return env
    try:
        from ._install import LIBRARY  # written by cmake --install
        if os.path.exists(LIBRARY):
            return LIBRARY
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "..", "build", "lib", "libpcs_worker.so.0")
    if os.path.exists(built):
        return os.path.normpath(built)
    return ctypes.util.find_library("pcs_worker") or "libpcs_worker.so.0"


_lib = None

_INIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64,
                            ctypes.c_uint64, ctypes.POINTER(ctypes.c_float))
_INIT64_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64,
                              ctypes.c_uint64, ctypes.POINTER(ctypes.c_double))


class _Options(ctypes.Structure):
    _fields_ = [("coordinator", ctypes.c_char_p), ("identity", ctypes.c_char_p),
                ("hostname", ctypes.c_char_p), ("join_timeout_ms", ctypes.c_uint32),
                ("coll_timeout_ms", ctypes.c_uint32), ("init", _INIT_FN),
                ("init_ctx", ctypes.c_void_p), ("backend", ctypes.c_char_p),
                ("device", ctypes.c_int)]


class _UnitInfo(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char_p), ("n_params", ctypes.c_size_t),
                ("padded_numel", ctypes.c_uint64), ("param_dtype", ctypes.c_int),
                ("is_root", ctypes.c_int)]


class _ParamInfo(ctypes.Structure):
    _fields_ = [("fqn", ctypes.c_char_p), ("unit", ctypes.c_uint32), ("offset", ctypes.c_uint64),
                ("numel", ctypes.c_uint64), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.c_uint64 * 8)]


class _UnitPolicy(ctypes.Structure):
    _fields_ = [("mixed_precision", ctypes.c_int), ("cast_forward_inputs", ctypes.c_int),
                ("reshard_after_forward", ctypes.c_int),
                ("keep_low_precision_grads", ctypes.c_int), ("input_dtype", ctypes.c_int),
                ("reduce_dtype", ctypes.c_int), ("master_dtype", ctypes.c_int),
                ("buffer_dtype", ctypes.c_int), ("output_dtype", ctypes.c_int),
                ("n_modules", ctypes.c_size_t), ("modules", ctypes.POINTER(ctypes.c_char_p)),
                ("unmanaged", ctypes.c_int), ("full_precision_eval", ctypes.c_int),
                ("keep_gathered_in_accumulation", ctypes.c_int)]


class _Memory(ctypes.Structure):
    _fields_ = [("step_peak_bytes", ctypes.c_uint64), ("peak_bytes", ctypes.c_uint64),
                ("reserved_bytes", ctypes.c_uint64), ("promised_bytes", ctypes.c_uint64)]


class _StepResult(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64), ("loss", ctypes.c_double),
                ("grad_norm", ctypes.c_double), ("skipped", ctypes.c_int),
                ("loss_scale", ctypes.c_double), ("done", ctypes.c_int)]


def _load():
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(library_path())
    P = ctypes.c_void_p
    st = ctypes.c_int
    sig = {
        "pcs_last_error": (ctypes.c_char_p, []),
        "pcs_status_str": (ctypes.c_char_p, [st]),
        "pcs_worker_join_as": (st, [ctypes.POINTER(_Options), ctypes.c_char_p,
                                    ctypes.POINTER(P)]),
        "pcs_worker_join_as_f64": (st, [ctypes.POINTER(_Options), ctypes.c_char_p, _INIT64_FN,
                                        ctypes.POINTER(P)]),
        "pcs_worker_rank": (ctypes.c_uint32, [P]),
        "pcs_worker_world_size": (ctypes.c_uint32, [P]),
        "pcs_worker_dp_rank": (ctypes.c_uint32, [P]),
        "pcs_worker_dp_size": (ctypes.c_uint32, [P]),
        "pcs_worker_total_steps": (ctypes.c_uint64, [P]),
        "pcs_worker_micro_batches": (ctypes.c_uint32, [P]),
        "pcs_worker_eval_backward": (ctypes.c_int, [P]),
        "pcs_worker_micro_batch_size": (ctypes.c_uint32, [P]),
        "pcs_worker_job_id": (ctypes.c_char_p, [P]),
        "pcs_worker_num_units": (ctypes.c_size_t, [P]),
        "pcs_worker_unit": (st, [P, ctypes.c_uint32, ctypes.POINTER(_UnitInfo)]),
        "pcs_worker_unit_policy": (st, [P, ctypes.c_uint32, ctypes.POINTER(_UnitPolicy)]),
        "pcs_worker_param": (st, [P, ctypes.c_uint32, ctypes.c_size_t,
                                  ctypes.POINTER(_ParamInfo)]),
        "pcs_worker_find_param": (st, [P, ctypes.c_char_p, ctypes.POINTER(_ParamInfo)]),
        "pcs_worker_stream": (P, [P]),
        "pcs_worker_begin_step": (st, [P]),
        "pcs_worker_unshard": (st, [P, ctypes.c_uint32, ctypes.POINTER(P),
                                    ctypes.POINTER(ctypes.c_int)]),
        "pcs_worker_prefetch": (st, [P, ctypes.c_uint32]),
        "pcs_worker_unshard_full": (st, [P, ctypes.c_uint32, ctypes.POINTER(P)]),
        "pcs_worker_unshard_master": (st, [P, ctypes.c_uint32, ctypes.POINTER(P),
                                           ctypes.POINTER(ctypes.c_int)]),
        "pcs_worker_grad_buffer_full": (st, [P, ctypes.c_uint32, ctypes.POINTER(P)]),
        "pcs_worker_reshard": (st, [P, ctypes.c_uint32]),
        "pcs_worker_grad_buffer": (st, [P, ctypes.c_uint32, ctypes.POINTER(P),
                                        ctypes.POINTER(ctypes.c_int)]),
        "pcs_worker_hand_in_grads": (st, [P, ctypes.c_uint32, ctypes.c_int]),
        "pcs_worker_step": (st, [P, ctypes.c_double, ctypes.POINTER(_StepResult)]),
        "pcs_worker_loss_scale": (ctypes.c_double, [P]),
        "pcs_worker_memory": (st, [P, ctypes.POINTER(_Memory)]),
        "pcs_worker_finish": (st, [P, ctypes.c_char_p]),
        "pcs_worker_abort": (None, [P, ctypes.c_char_p]),
        "pcs_worker_destroy": (None, [P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    _lib = lib
    return lib


def _check(code):
    if code != 0:
        lib = _load()
        msg = lib.pcs_last_error() or b""
        raise PcsError(code, (lib.pcs_status_str(code) or b"?").decode(),
                       msg.decode("utf-8", "replace"))


def _b(s):
    return None if s is None else s.encode()


# ---- what the plan says --------------------------------------------------------------------------

class UnitInfo:
    """A unit of the plan: ``path`` (module rooting it, "" = root), ``n_params``,
    ``padded_numel`` (flat buffer length), ``param_dtype`` (pcs name), ``is_root``."""

    def __init__(self, index, ci):
        self.index = index
        self.path = ci.path.decode()
        self.n_params = ci.n_params
        self.padded_numel = ci.padded_numel
        self.param_dtype = dtype_name(ci.param_dtype)
        self.is_root = bool(ci.is_root)

    def __repr__(self):
        return "UnitInfo(%d, path=%r, n_params=%d, padded_numel=%d, param_dtype=%s)" % (
            self.index, self.path, self.n_params, self.padded_numel, self.param_dtype)


class ParamInfo:
    """A parameter's place: ``fqn``, ``unit``, ``offset`` (elements into the unit's flat
    buffer), ``numel``, ``shape``."""

    def __init__(self, ci):
        self.fqn = ci.fqn.decode()
        self.unit = ci.unit
        self.offset = ci.offset
        self.numel = ci.numel
        self.shape = tuple(ci.shape[d] for d in range(ci.ndim))

    def __repr__(self):
        return "ParamInfo(%r, unit=%d, offset=%d, shape=%r)" % (self.fqn, self.unit, self.offset,
                                                                self.shape)


class UnitPolicy:
    """The forward-side mixed-precision policy of a unit (pcs casts parameters and gradients
    itself): ``input_dtype`` / ``output_dtype`` / ``buffer_dtype`` (pcs names, None = no cast /
    keep; ``cast_forward_inputs`` is the plan's flag behind input_dtype),
    ``reshard_after_forward``, ``mixed_precision``, ``reduce_dtype``, ``master_dtype``,
    ``keep_low_precision_grads``, ``modules`` (FQNs whose parameters the unit owns)."""

    def __init__(self, ci):
        self.mixed_precision = bool(ci.mixed_precision)
        self.cast_forward_inputs = bool(ci.cast_forward_inputs)
        self.reshard_after_forward = bool(ci.reshard_after_forward)
        self.keep_low_precision_grads = bool(ci.keep_low_precision_grads)
        self.input_dtype = dtype_name(ci.input_dtype) if ci.input_dtype else None
        self.reduce_dtype = dtype_name(ci.reduce_dtype) if ci.reduce_dtype else None
        self.master_dtype = dtype_name(ci.master_dtype)
        self.buffer_dtype = dtype_name(ci.buffer_dtype) if ci.buffer_dtype else None
        self.output_dtype = dtype_name(ci.output_dtype) if ci.output_dtype else None
        self.modules = [ci.modules[k].decode() for k in range(ci.n_modules)]
        self.unmanaged = bool(ci.unmanaged)
        self.full_precision_eval = bool(ci.full_precision_eval)
        self.keep_gathered = bool(ci.keep_gathered_in_accumulation)


class StepResult:
    """What pcs_worker_step returned: ``step`` (1-based), ``loss`` (mean over data-parallel
    ranks), ``grad_norm``, ``skipped`` (grad scaler found Inf/NaN), ``loss_scale`` (for the next
    step), ``done`` (the job's last step)."""

    def __init__(self, ci):
        self.step = ci.step
        self.loss = ci.loss
        self.grad_norm = ci.grad_norm
        self.skipped = bool(ci.skipped)
        self.loss_scale = ci.loss_scale
        self.done = bool(ci.done)

    def __repr__(self):
        return "StepResult(step=%d, loss=%g, grad_norm=%g, skipped=%s, loss_scale=%g)" % (
            self.step, self.loss, self.grad_norm, self.skipped, self.loss_scale)


# ---- buffers -------------------------------------------------------------------------------------

class _CudaWords:
    """A device buffer of 16-bit words as int16 for torch.as_tensor (then viewed as bf16)."""

    def __init__(self, address, numel):
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": "<i2",
                                         "data": (address, False), "version": 3,
                                         "strides": None}


class Buffer:
    """pcs's memory: ``address``, ``numel``, ``dtype`` (pcs name), ``nbytes``, ``device``
    ("cpu" or "cuda"). Views, not copies; valid as long as pcs says (see the module doc)."""

    def __init__(self, address, numel, dtype, device):
        self.address = address or 0
        self.numel = numel
        self.dtype_code = dtype
        self.dtype = dtype_name(dtype)
        self.nbytes = numel * _DTYPE_SIZES.get(dtype, 0)
        self.device = device

    @property
    def __cuda_array_interface__(self):
        if self.device != "cuda":
            raise AttributeError("a host buffer has no __cuda_array_interface__")
        return {"shape": (self.numel,), "typestr": _TYPESTR[self.dtype_code],
                "data": (self.address, False), "version": 3, "strides": None}

    def torch(self):
        """A torch tensor over the buffer (bf16 included), no copy."""
        import torch
        tdt = {DTYPE_FP32: torch.float32, DTYPE_BF16: torch.bfloat16, DTYPE_FP16: torch.float16,
               DTYPE_FP64: torch.float64, DTYPE_INT64: torch.int64}[self.dtype_code]
        if self.numel == 0:
            return torch.empty(0, dtype=tdt, device=self.device)
        if self.device == "cuda":
            if self.dtype_code == DTYPE_BF16:  # no bf16 typestr; torch < 2.3 has no uint16
                words = _CudaWords(self.address, self.numel)
                return torch.as_tensor(words, device="cuda").view(torch.bfloat16)
            return torch.as_tensor(self, device="cuda")
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.address)
        return torch.frombuffer(raw, dtype=tdt)

    def numpy(self):
        """A numpy array over a host buffer (bf16 as uint16 words), no copy."""
        import numpy as np
        if self.device != "cpu":
            raise ValueError("numpy(): a device buffer is not host memory")
        if self.numel == 0:
            return np.empty(0, dtype=np.dtype(_TYPESTR[self.dtype_code]))
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.address)
        return np.frombuffer(raw, dtype=np.dtype(_TYPESTR[self.dtype_code]))


# ---- the worker ----------------------------------------------------------------------------------

class Worker:
    """A joined pcs worker (pcs_worker_join). ``init(fqn, first, n)`` gives elements
    [first, first + n) of parameter ``fqn``'s initial value, flattened: a contiguous float32 cpu
    tensor, a sequence of n floats, or n float32 through the buffer protocol; None uses pcs's own
    initialisation. ``init64(fqn, first, n)`` gives them as float64 (the same forms) for units
    with fp64 masters; None widens ``init``'s. ``program`` is
    what this process registers as (a job naming it in spec.program comes only to such
    workers)."""

    def __init__(self, coordinator, identity=None, hostname=None, join_timeout_ms=0,
                 coll_timeout_ms=0, init=None, backend=None, device=-1, program=None,
                 init64=None):
        lib = _load()
        self._lib = lib
        self._w = ctypes.c_void_p()
        self._init_error = None
        self._keep = []  # strings and the callback: alive while C may use them

        def fill(fn, what, ctype, tname, _ctx, fqn, first, n, out):
            """Copy fn(fqn, first, n)'s n values into out (ctype elements): a contiguous cpu
            tensor of torch dtype tname, a sequence, or the buffer protocol."""
            try:
                vals = fn(fqn.decode(), first, n)
                es = ctypes.sizeof(ctype)
                if hasattr(vals, "data_ptr"):  # a torch tensor: n contiguous elements
                    if (vals.numel() != n or str(vals.dtype) != "torch." + tname
                            or not vals.is_contiguous() or vals.device.type != "cpu"):
                        raise ValueError("%s(%s): want %d contiguous %s on the cpu" %
                                         (what, fqn.decode(), n, tname))
                    ctypes.memmove(out, vals.data_ptr(), es * n)
                elif isinstance(vals, (list, tuple)):
                    if len(vals) != n:
                        raise ValueError("%s(%s): %d values for %d" % (what, fqn.decode(),
                                                                       len(vals), n))
                    (ctype * n).from_address(ctypes.addressof(out.contents))[:] = vals
                else:  # the buffer protocol: n elements
                    mv = memoryview(vals).cast("B")
                    if mv.nbytes != es * n:
                        raise ValueError("%s(%s): %d bytes for %d %s" % (what, fqn.decode(),
                                                                         mv.nbytes, n, tname))
                    ctypes.memmove(out, (ctypes.c_uint8 * mv.nbytes).from_buffer_copy(mv),
                                   mv.nbytes)
                return 0
            except BaseException as e:  # never let an exception cross the C frame
                self._init_error = e
                return 1  # PCS_ERR_INVALID_ARG

        def init_cb(_ctx, fqn, first, n, out):
            return fill(init, "init", ctypes.c_float, "float32", _ctx, fqn, first, n, out)

        def init64_cb(_ctx, fqn, first, n, out):
            return fill(init64, "init64", ctypes.c_double, "float64", _ctx, fqn, first, n, out)

        opt = _Options()
        opt.coordinator = _b(coordinator)
        opt.identity = _b(identity)
        opt.hostname = _b(hostname)
        opt.join_timeout_ms = join_timeout_ms
        opt.coll_timeout_ms = coll_timeout_ms
        if init is not None:
            cb = _INIT_FN(init_cb)
            self._keep.append(cb)
            opt.init = cb
        opt.backend = _b(backend)
        opt.device = device
        self._keep.append(opt)
        cb64 = _INIT64_FN(init64_cb) if init64 is not None else _INIT64_FN()
        self._keep.append(cb64)
        code = lib.pcs_worker_join_as_f64(ctypes.byref(opt), _b(program), cb64,
                                          ctypes.byref(self._w))
        if code != 0 and self._init_error is not None:
            raise PcsError(code, "invalid_arg",
                           "init: %r" % (self._init_error,)) from self._init_error
        _check(code)
        self.device = "cuda" if backend == "cuda" else "cpu"
        self.units = [self._unit(u) for u in range(lib.pcs_worker_num_units(self._w))]

    def _unit(self, u):
        ci = _UnitInfo()
        _check(self._lib.pcs_worker_unit(self._w, u, ctypes.byref(ci)))
        return UnitInfo(u, ci)

    def _handle(self):
        if not self._w:
            raise PcsError(PCS_ERR_STATE, "state", "the worker was destroyed")
        return self._w

    # who and what
    @property
    def rank(self):
        return self._lib.pcs_worker_rank(self._handle())

    @property
    def world_size(self):
        return self._lib.pcs_worker_world_size(self._handle())

    @property
    def dp_rank(self):
        return self._lib.pcs_worker_dp_rank(self._handle())

    @property
    def dp_size(self):
        return self._lib.pcs_worker_dp_size(self._handle())

    @property
    def total_steps(self):
        return self._lib.pcs_worker_total_steps(self._handle())

    @property
    def eval_backward(self):
        """Whether the job allows an eval-mode backward reduced in full precision."""
        return bool(self._lib.pcs_worker_eval_backward(self._handle()))

    @property
    def micro_batches(self):
        return self._lib.pcs_worker_micro_batches(self._handle())

    @property
    def micro_batch_size(self):
        return self._lib.pcs_worker_micro_batch_size(self._handle())

    @property
    def job_id(self):
        return self._lib.pcs_worker_job_id(self._handle()).decode()

    @property
    def stream(self):
        """The cudaStream_t pcs orders its work on (an int), None on the cpu backend."""
        return self._lib.pcs_worker_stream(self._handle())

    @property
    def loss_scale(self):
        return self._lib.pcs_worker_loss_scale(self._handle())

    def memory(self):
        """The runtime's memory against the plan's promise (pcs_worker_memory): a dict of
        ``step_peak_bytes``, ``peak_bytes``, ``reserved_bytes`` and ``promised_bytes``."""
        m = _Memory()
        _check(self._lib.pcs_worker_memory(self._handle(), ctypes.byref(m)))
        return {k: getattr(m, k) for k, _ in _Memory._fields_}

    def unit_policy(self, unit):
        ci = _UnitPolicy()
        _check(self._lib.pcs_worker_unit_policy(self._handle(), unit, ctypes.byref(ci)))
        return UnitPolicy(ci)

    def params(self, unit):
        """The parameters of ``unit`` in flat-buffer order."""
        out = []
        for k in range(self.units[unit].n_params):
            ci = _ParamInfo()
            _check(self._lib.pcs_worker_param(self._handle(), unit, k, ctypes.byref(ci)))
            out.append(ParamInfo(ci))
        return out

    def find_param(self, fqn):
        ci = _ParamInfo()
        _check(self._lib.pcs_worker_find_param(self._handle(), _b(fqn), ctypes.byref(ci)))
        return ParamInfo(ci)

    # the step
    def begin_step(self):
        _check(self._lib.pcs_worker_begin_step(self._handle()))

    def unshard(self, unit):
        """All-gather ``unit``: its flat buffer (valid until reshard)."""
        p, dt = ctypes.c_void_p(), ctypes.c_int()
        _check(self._lib.pcs_worker_unshard(self._handle(), unit, ctypes.byref(p),
                                            ctypes.byref(dt)))
        return Buffer(p.value, self.units[unit].padded_numel, dt.value, self.device)

    def unshard_full(self, unit):
        """Full-precision eval: all-gather ``unit``'s fp32 masters (valid until reshard)."""
        p = ctypes.c_void_p()
        _check(self._lib.pcs_worker_unshard_full(self._handle(), unit, ctypes.byref(p)))
        return Buffer(p.value, self.units[unit].padded_numel, DTYPE_FP32, self.device)

    def unshard_master(self, unit):
        """All-gather ``unit``'s masters in their storage dtype (fp32, fp64 for fp64 masters;
        a unit computing in its master dtype: its parameters). Valid until reshard."""
        p, dt = ctypes.c_void_p(), ctypes.c_int()
        _check(self._lib.pcs_worker_unshard_master(self._handle(), unit, ctypes.byref(p),
                                                   ctypes.byref(dt)))
        return Buffer(p.value, self.units[unit].padded_numel, dt.value, self.device)

    def prefetch(self, unit):
        _check(self._lib.pcs_worker_prefetch(self._handle(), unit))

    def reshard(self, unit):
        _check(self._lib.pcs_worker_reshard(self._handle(), unit))

    def grad_buffer(self, unit):
        """The zeroed buffer for ``unit``'s gradients (valid until the hand-in)."""
        p, dt = ctypes.c_void_p(), ctypes.c_int()
        _check(self._lib.pcs_worker_grad_buffer(self._handle(), unit, ctypes.byref(p),
                                                ctypes.byref(dt)))
        return Buffer(p.value, self.units[unit].padded_numel, dt.value, self.device)

    def grad_buffer_full(self, unit):
        """An eval-mode backward (training.eval_backward): the zeroed fp32 buffer for ``unit``'s
        gradients; its hand-in (sync) reduces them in full precision."""
        p = ctypes.c_void_p()
        _check(self._lib.pcs_worker_grad_buffer_full(self._handle(), unit, ctypes.byref(p)))
        return Buffer(p.value, self.units[unit].padded_numel, DTYPE_FP32, self.device)

    def hand_in_grads(self, unit, sync=True):
        _check(self._lib.pcs_worker_hand_in_grads(self._handle(), unit, 1 if sync else 0))

    def step(self, loss):
        """The optimizer step on the shards and the step report; ``loss`` is this rank's mean
        loss of the step."""
        r = _StepResult()
        _check(self._lib.pcs_worker_step(self._handle(), float(loss), ctypes.byref(r)))
        return StepResult(r)

    def finish(self, error=None):
        """Leave the job: error None reports success, else the job fails with ``error``."""
        _check(self._lib.pcs_worker_finish(self._handle(), _b(error)))

    def abort(self, reason="aborted"):
        if self._w:
            self._lib.pcs_worker_abort(self._w, _b(reason))

    def destroy(self):
        if self._w:
            self._lib.pcs_worker_destroy(self._w)
            self._w = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._w:
            try:
                self.finish(None if exc is None else "%s: %s" % (exc_type.__name__, exc))
            except PcsError:
                if exc is None:
                    raise
            finally:
                self.destroy()
        return False

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
