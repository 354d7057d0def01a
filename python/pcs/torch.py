"""An ``nn.Module`` on pcs: PyTorch does the math, pcs owns the parameters and the communication.

    spec = pcs.torch.job_spec(model, wrap={"explicit": {"paths": ["layers.0", "layers.1"]}},
                              precision={...}, ...)
    # submit it (pcsctl submit job.json), then in each of the job's N processes:
    model = pcs.torch.shard(build_model(), coordinator="127.0.0.1:7070")
    for step in range(model.total_steps):
        for mb in range(model.micro_batches):
            with model.no_sync() if mb + 1 < model.micro_batches else contextlib.nullcontext():
                loss = loss_fn(model(x[mb]), y[mb])
                model.backward(loss)       # loss x loss scale / micro_batches, then backward
        model.step(mean_loss)              # optimizer on the fp32 shards, step report
    model.finish()

What :func:`shard` does, per the plan the coordinator sent (the FSDP1 runtime's order):

- Every unit (a module that roots a unit of the plan) gets a forward pre-hook that all-gathers
  it (pcs_worker_unshard, in the plan's param_dtype), copies the flat buffer into a tensor
  PyTorch owns (pcs's buffer goes back at once) and makes the unit's parameters views into it;
  then casts floating positional inputs to the plan's input dtype (param_dtype where
  cast_forward_inputs).
  Keyword inputs are not cast (torch 1.13 forward pre-hooks do not see them).
- Its forward post-hook casts floating outputs to output_dtype (if set), frees the unsharded
  tensor where the plan reshards after forward (storage resized to 0, as FSDP1's
  ``_free_storage``; autograd's saved views keep the storage object) and hooks the outputs so
  that the unit is gathered again before its backward.
- Outside a unit's forward and backward its parameters are empty tensors of the master dtype
  (FSDP shows the fp32 shard there) and their ``.grad`` is None: pcs holds the gradients.
- A hook on each AccumulateGrad node the unit's forwards used counts its gradients; when all are
  in, they are copied into the unit's gradient buffer and handed in (sync unless inside
  :meth:`ShardedModule.no_sync`), and the unsharded tensor is freed (a unit with frozen
  parameters at the end of the backward: they may still be needed for the input gradient). A callback at the end of the
  backward hands in what is left (unused parameters: zero); on a synced micro-batch every unit
  not yet synced this step is handed in.
- A unit with mixed precision off (an ignored class such as BatchNorm) in a mixed-precision job
  gets its inputs upcast to its own dtype and hands its output back in the dtype it was given
  (FSDP1's ``_override_module_mixed_precision`` hooks).
- Module buffers are kept in the unit's buffer_dtype. Frozen parameters (requires_grad False)
  are declared frozen in the job spec, are never handed a gradient and never change.
- Shared (tied) parameters are declared with ``shared`` in the spec; the plan keeps them in one
  unit (the lowest common ancestor of their users), which is live while any user runs.
"""

import contextlib
import ctypes
import functools
import json

import torch
from torch import nn

from . import worker as _w

__all__ = ["model_spec", "job_spec", "write_job", "shard", "ShardedModule", "torch_dtype"]

_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "fp64": torch.float64, "int64": torch.int64}
_PCS = {v: k for k, v in _TORCH.items()}
_PCS[torch.int32] = "int64"  # declared for the plan's memory account only
PROGRAM = "pcs.torch"


def torch_dtype(name):
    """The torch dtype of a pcs dtype name (fp32, bf16, fp16, fp64, int64)."""
    return _TORCH[name]


# ---- the job spec from a module ------------------------------------------------------------------

def model_spec(module):
    """The job's ``model`` section for ``module``: ``{"explicit": {"modules": [...]}}``, one
    declaration per module (path, class, parameters with their shapes and dtypes, frozen ones
    marked, buffers with their dtypes, shared parameters pointing at their first owner)."""
    if not isinstance(module, nn.Module):
        raise TypeError("model_spec: want an nn.Module, got %s" % type(module).__name__)
    owner = {}
    mods = []
    for path, m in module.named_modules():
        decl = {"path": path, "class": type(m).__name__}
        params, shared, buffers = [], [], []
        for name, p in m._parameters.items():
            if p is None:
                continue
            fqn = path + "." + name if path else name
            if id(p) in owner:
                shared.append({"name": name, "shares": owner[id(p)]})
                continue
            owner[id(p)] = fqn
            t = {"name": name, "shape": list(p.shape)}
            if p.dtype != torch.float32:  # its own dtype: the masters' (FSDP's orig dtype)
                if p.dtype not in _PCS or not p.is_floating_point():
                    raise ValueError("model_spec: parameter %s has dtype %s, which pcs does not "
                                     "train" % (fqn, p.dtype))
                t["dtype"] = _PCS[p.dtype]
            if not p.requires_grad:
                t["requires_grad_off"] = True
            params.append(t)
        for name, b in m._buffers.items():
            if b is None:
                continue
            t = {"name": name, "shape": list(b.shape)}
            if b.dtype == torch.bool:
                t["dtype"] = "int64"  # a mask: declared for the memory account only
            elif b.dtype != torch.float32:
                if b.dtype not in _PCS:
                    raise ValueError("model_spec: buffer %s has dtype %s, which pcs does not "
                                     "declare" % (path + "." + name if path else name, b.dtype))
                t["dtype"] = _PCS[b.dtype]
            buffers.append(t)
        if params:
            decl["params"] = params
        if buffers:
            decl["buffers"] = buffers
        if shared:
            decl["shared"] = shared
        mods.append(decl)
    return {"explicit": {"modules": mods}}


def job_spec(module, **sections):
    """A whole job spec for ``module``: its ``model`` section, ``program: pcs.torch`` (so the
    coordinator gives the job to processes that joined through this package) and the other
    sections as given (``wrap``, ``precision``, ``strategy``, ``mesh``, ``training``, ...)."""
    spec = {"program": PROGRAM}
    spec.update(sections)
    spec["model"] = model_spec(module)
    return spec


def write_job(path, module, **sections):
    """Write :func:`job_spec` as JSON (``pcsctl submit`` reads JSON and YAML)."""
    with open(path, "w") as f:
        json.dump(job_spec(module, **sections), f, indent=1)


# ---- the sharded module --------------------------------------------------------------------------

def _map_floats(x, fn):
    if torch.is_tensor(x):
        return fn(x) if torch.is_floating_point(x) else x
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_map_floats(v, fn) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_map_floats(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map_floats(v, fn) for k, v in x.items()}
    return x


def _tensors(x, out):
    if torch.is_tensor(x):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, out)
    return out


def _error(status, message):
    """A PcsError raised by this package, named like pcs's own (pcs_status_str)."""
    code = {"invalid_arg": _w.PCS_ERR_INVALID_ARG, "state": _w.PCS_ERR_STATE}[status]
    return _w.PcsError(code, status, message)


class _Unit:
    def __init__(self, info, policy, module, params):
        self.index = info.index
        self.info = info
        self.policy = policy
        self.module = module
        self.params = params  # [(Parameter, ParamInfo)]
        self.dtype = _TORCH[info.param_dtype]
        self.full = torch.empty(info.padded_numel, dtype=self.dtype)
        self.views = [self.full.narrow(0, pi.offset, pi.numel).view(pi.shape)
                      for _, pi in params]
        self.full.storage().resize_(0)
        # outside its forward and backward a parameter is an empty tensor of the master dtype
        # (FSDP shows its fp32 shard there): what it is, without memory
        self.empty = torch.empty(0, dtype=_TORCH[policy.master_dtype])
        # ... but inside a step a freed parameter keeps its param dtype: a dtype change would make
        # PyTorch drop the parameter's hooked AccumulateGrad node (a forward re-run by
        # checkpointing would then create an unhooked one)
        self.empty_p = torch.empty(0, dtype=self.dtype)
        self.live = False
        # a frozen parameter may still be needed after the trainable ones' gradients are in (the
        # input gradient of its op): such a unit is freed at the end of the backward
        self.has_frozen = any(not p.requires_grad for p, _ in params)
        # The AccumulateGrad nodes this unit's forwards used since its last backward: PyTorch
        # makes a new node when a parameter's .data changes dtype (a mixed-precision parameter
        # between its master-dtype placeholder and its param_dtype view), so a module called
        # twice may use two per parameter. The unit is handed in when all of them have fired.
        self.hooked = []  # [(node, token)]: nodes carrying our hook (identity, not id(): ids
        #                   of freed wrappers are reused)
        self.nodes = set()  # tokens of the nodes this pass's forwards used
        self.fired = set()
        self.fresh = True  # the next forward starts a new set of nodes
        self.used = False  # ran forward since the last backward
        self.handed = False  # handed in during this backward
        self.synced = False  # handed in with sync this step
        self.input_dtype = None  # mixed precision off: the dtype its output goes back to
        self.full_m = None  # full-precision eval: the masters, fp32 or fp64 (on first use)
        self.views_m = []
        self.live_full = False  # live holds full_m, not full
        self.full_bwd = False  # this pass is an eval-mode backward in full precision
        # a dtype part (the parameters of another dtype of a mixed-dtype group, a unit of their
        # own on the same module, right after its unit): gathered and reduced as a unit, but the
        # module's inputs and outputs are its unit's to cast
        self.part = False


class ShardedModule:
    """``module`` driven by pcs (see the module doc). Call it like the module; ``backward``,
    ``no_sync``, ``step``, ``finish``; ``worker`` is the :class:`pcs.worker.Worker`."""

    def __init__(self, module, worker, prefetch=True):
        self.module = module
        self.worker = worker
        # forward/backward prefetch: the next unit in the last step's forward order (the
        # previous one in backward) is all-gathered by pcs's prefetch thread while PyTorch
        # computes the current one
        self._prefetch = prefetch
        self._order, self._order_now = [], []
        self._prefetched = set()
        self._sync = True
        self._in_step = False
        self._callback_queued = False
        self._in_backward = False  # between the first pre-backward hook and _backward_done
        self._fired_any = False  # some AccumulateGrad node fired in this backward
        self._tokens = 0  # the hook tokens handed out (never reused)
        self._hooks = []
        params = dict(module.named_parameters())
        mods = dict(module.named_modules())
        seen = set()
        self._mixed = False  # some unit computes in another dtype than its master
        self.units = []
        for info in worker.units:
            plist = []
            for pi in worker.params(info.index):
                if pi.fqn not in params:
                    raise _error("invalid_arg",
                                 "the plan's parameter %s is not a parameter of the module "
                                      "(was the job submitted with pcs.torch.job_spec of this "
                                      "model?)" % pi.fqn)
                p = params[pi.fqn]
                if tuple(p.shape) != pi.shape:
                    raise _error("invalid_arg",
                                 "parameter %s: shape %s in the module, %s in the plan" %
                                      (pi.fqn, tuple(p.shape), pi.shape))
                plist.append((p, pi))
                seen.add(pi.fqn)
            if info.path not in mods:
                raise _error("invalid_arg",
                             "the plan's unit %d roots at %r, not a module of the model" %
                                  (info.index, info.path))
            u = _Unit(info, worker.unit_policy(info.index), mods[info.path], plist)
            u.part = (not u.policy.unmanaged and not u.policy.modules and
                      any(v.info.path == info.path and not v.policy.unmanaged
                          for v in self.units))
            self._mixed = self._mixed or (u.policy.mixed_precision and
                                          info.param_dtype != u.policy.master_dtype)
            self.units.append(u)
        missing = sorted(set(params) - seen)
        if missing:
            raise _error("invalid_arg",
                         "parameters of the module not in the plan: %s" %
                              ", ".join(missing[:8]))
        # the parameters now live in pcs (fp32 shards): drop the module's own copies
        for u in self.units:
            for p, _ in u.params:
                p.data = u.empty
                p.grad = None
        # every floating buffer's own dtype: full-precision eval runs in it (FSDP1 casts them
        # back for eval and to buffer_dtype again for training)
        self._mods = mods
        self._buffer_dtypes = {(path, name): b.dtype for path, m in mods.items()
                               for name, b in m._buffers.items()
                               if b is not None and torch.is_floating_point(b)}
        self._buffers_full = False
        self._full_eval = any(u.policy.full_precision_eval for u in self.units)
        # training.eval_backward: an eval-mode backward under full_precision_eval reduces its
        # fp32 gradients in full precision (FSDP1); without it such a backward is refused
        self._eval_bwd = self.worker.eval_backward
        self._pass_full = False
        self._cast_buffers(mods)
        for u in self.units:
            self._hooks.append(u.module.register_forward_pre_hook(
                functools.partial(self._pre_forward, u)))
            self._hooks.append(u.module.register_forward_hook(
                functools.partial(self._post_forward, u)))

    # -- what the job says
    @property
    def rank(self):
        return self.worker.rank

    @property
    def world_size(self):
        return self.worker.world_size

    @property
    def dp_rank(self):
        return self.worker.dp_rank

    @property
    def dp_size(self):
        return self.worker.dp_size

    @property
    def total_steps(self):
        return self.worker.total_steps

    @property
    def micro_batches(self):
        return self.worker.micro_batches

    @property
    def micro_batch_size(self):
        return self.worker.micro_batch_size

    @property
    def loss_scale(self):
        return self.worker.loss_scale

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # -- buffers in the plan's buffer dtype
    def _cast_buffers(self, mods):
        unit_of = {}
        for u in self.units:
            for m in u.policy.modules:
                unit_of[m] = u
        roots = sorted((u for u in self.units if not u.part), key=lambda u: len(u.info.path))
        for path, m in mods.items():
            u = unit_of.get(path)
            if u is None:  # no parameters of its own: the unit of its nearest ancestor root
                for r in roots:
                    rp = r.info.path
                    if rp == "" or path == rp or path.startswith(rp + "."):
                        u = r
            if u is None or not u.policy.buffer_dtype:
                continue
            dt = _TORCH[u.policy.buffer_dtype]
            for name, b in m._buffers.items():
                if b is not None and torch.is_floating_point(b) and b.dtype != dt:
                    m._buffers[name] = b.to(dt)

    def _buffers_to(self, full):
        """Floating buffers in their own dtype (full-precision eval) or the plan's again."""
        if full == self._buffers_full:
            return
        if full:
            for (path, name), dt in self._buffer_dtypes.items():
                m = self._mods[path]
                b = m._buffers.get(name)
                if b is not None and b.dtype != dt:
                    m._buffers[name] = b.to(dt)
        else:
            self._cast_buffers(self._mods)
        self._buffers_full = full

    # -- unshard / free
    def _gather_full(self, u):
        """Full-precision eval: the unit's masters (fp32; fp64 ones in fp64), a copy PyTorch
        owns (freed after the unit's forward)."""
        self._prefetched.discard(u.index)  # (a queued prefetch is given back with it)
        buf = self.worker.unshard_master(u.index)
        if u.full_m is None:
            u.full_m = torch.empty(u.info.padded_numel, dtype=_TORCH[buf.dtype])
            u.views_m = [u.full_m.narrow(0, pi.offset, pi.numel).view(pi.shape)
                         for _, pi in u.params]
        elif u.full_m.storage().size() == 0:
            u.full_m.storage().resize_(u.info.padded_numel)
        ctypes.memmove(u.full_m.data_ptr(), buf.address, buf.nbytes)
        self.worker.reshard(u.index)
        for (p, _), v in zip(u.params, u.views_m):
            p.data = v
        u.live = u.live_full = True

    def _prefetch_next(self, u, step):
        """Queue the all-gather of the unit `step` places from u in forward order (a unit's
        dtype part comes right after it: its gather is queued first, ahead of the next
        module's)."""
        if not self._prefetch or u.index not in self._order:
            return
        k = self._order.index(u.index) + step
        if 0 <= k < len(self._order):
            n = self.units[self._order[k]]
            if not n.live and n.index not in self._prefetched:
                self.worker.prefetch(n.index)
                self._prefetched.add(n.index)

    def _drop_prefetched(self):
        """Prefetched gathers nobody consumed go back before the step changes the masters."""
        for i in sorted(self._prefetched):
            self.worker.reshard(i)
        self._prefetched.clear()

    def _gather(self, u):
        self._prefetched.discard(u.index)  # the unshard consumes a queued prefetch
        buf = self.worker.unshard(u.index)
        if buf.dtype != u.info.param_dtype or buf.numel != u.info.padded_numel:
            raise _error("state", "unit %d: pcs gathered %d %s, the plan says %d %s" %
                         (u.index, buf.numel, buf.dtype, u.info.padded_numel,
                          u.info.param_dtype))
        if u.full.storage().size() == 0:
            u.full.storage().resize_(u.info.padded_numel)
        ctypes.memmove(u.full.data_ptr(), buf.address, buf.nbytes)
        self.worker.reshard(u.index)  # pcs's buffer goes back; PyTorch's copy is the live one
        for (p, _), v in zip(u.params, u.views):
            p.data = v
        u.live = True

    def _free(self, u, final=False):
        """Give the unit's unsharded copy back; `final` (or outside a step): the parameters
        become master-dtype placeholders, else param-dtype ones (see _Unit.empty_p)."""
        if not u.live:
            if final:
                for p, _ in u.params:
                    p.data = u.empty
            return
        placeholder = u.empty if final or not self._in_step else u.empty_p
        for p, _ in u.params:
            p.data = placeholder
        if u.live_full:
            u.full_m.storage().resize_(0)
        else:
            u.full.storage().resize_(0)
        u.live = u.live_full = False

    def _begin(self):
        if not self._in_step:
            self.worker.begin_step()
            self._in_step = True
            self._callback_queued = False
            for u in self.units:
                u.synced = False

    def _pre_forward(self, u, _module, args):
        training = torch.is_grad_enabled()
        # FSDP_USE_FULL_PREC_IN_EVAL: an eval-mode forward of a mixed-precision unit runs on its
        # fp32 masters with no casts and the buffers in their own dtype
        full = u.policy.full_precision_eval and not u.module.training
        # an eval-mode forward with gradients in a full_precision_eval job: its backward
        # reduces in full precision (training.eval_backward), every unit's gradients in fp32
        full_bwd = training and not u.module.training and self._eval_bwd
        if training and not self._in_backward:
            self._pass_full = full_bwd  # the mode of this pass, for units it does not run
        full_bwd = full_bwd and u.policy.master_dtype == "fp32"  # else nothing fuller to use
        if full and training and not self._eval_bwd:
            raise _error("state", "unit %d (%r): an eval-mode forward with gradients under "
                         "training.full_precision_eval (FSDP reduces in full precision then) "
                         "needs training.eval_backward in the job; or run eval under "
                         "torch.no_grad()" % (u.index, u.info.path))
        u.full_bwd = full_bwd
        self._buffers_to(not u.module.training and self._full_eval)
        if training:  # an eval or no_grad forward opens no step
            self._begin()
        if u.live and u.live_full != full:
            self._free(u)
        if not u.live:
            self._gather_full(u) if full else self._gather(u)
        if full and not training:
            return None
        if training and not self._in_backward and not full:
            if u.index not in self._order_now:
                self._order_now.append(u.index)
            self._prefetch_next(u, +1)
        if training:
            u.used = True
            if u.fresh:  # a new pass: keep the hooked nodes the last one used
                u.hooked = [(n, t) for n, t in u.hooked if t in u.nodes]
                u.nodes, u.fired, u.fresh = set(), set(), False
                # requires_grad may change between passes (staged fine-tuning)
                u.has_frozen = any(not p.requires_grad for p, _ in u.params)
            for p, _ in u.params:
                if not p.requires_grad:
                    continue
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                token = next((t for n, t in u.hooked if n is node), None)
                if token is None:
                    self._tokens += 1
                    token = self._tokens
                    node.register_hook(functools.partial(self._node_ready, u, token))
                    u.hooked.append((node, token))
                u.nodes.add(token)
        if u.policy.unmanaged or full or u.part:
            return None  # (full precision: no casts; a part: its unit casts)
        if u.policy.input_dtype:
            dt = _TORCH[u.policy.input_dtype]
            return _map_floats(args, lambda t: t.to(dt))
        if not u.policy.mixed_precision and self._mixed and not u.policy.unmanaged:
            # FSDP1 _override_module_mixed_precision: a unit with mixed precision off (an
            # ignored class such as BatchNorm, a full_precision override) runs in its own dtype
            # on inputs upcast to it, and hands its output back in the dtype it was given
            floats = [t for t in _tensors(args, []) if torch.is_floating_point(t)]
            u.input_dtype = floats[-1].dtype if floats else None
            return _map_floats(args, lambda t: t.to(u.dtype))
        return None

    def _post_forward(self, u, _module, _args, out):
        if u.live_full and not torch.is_grad_enabled():  # full-precision eval: no casts
            self._free(u)
            return out
        if u.live_full:  # an eval-mode forward with gradients: no casts, its backward comes
            for t in _tensors(out, []):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._pre_backward, u))
            if u.policy.reshard_after_forward and not self._in_backward:
                self._free(u)
            return out
        if u.part:
            pass  # its unit casts the module's outputs
        elif u.policy.output_dtype:
            dt = _TORCH[u.policy.output_dtype]
            out = _map_floats(out, lambda t: t.to(dt))
        elif u.input_dtype is not None:
            back = u.input_dtype
            u.input_dtype = None
            out = _map_floats(out, lambda t: t.to(back))
        if not torch.is_grad_enabled():
            self._free(u)  # eval: nothing will come back for it
            return out
        for t in _tensors(out, []):
            if t.requires_grad:
                t.register_hook(functools.partial(self._pre_backward, u))
        if (u.policy.reshard_after_forward and not self._in_backward and
                (self._sync or not u.policy.keep_gathered)):
            # (a forward re-run inside the backward by activation checkpointing keeps the unit:
            # its backward comes next)
            self._free(u)
        return out

    # -- backward
    def _pre_backward(self, u, _grad):
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._callback_queued = True
        self._in_backward = True
        if not u.live:
            self._gather_full(u) if u.full_bwd and u.policy.full_precision_eval else self._gather(u)
        if not u.full_bwd:
            self._prefetch_next(u, -1)
        return None

    def _node_ready(self, u, token, *_unused):
        self._fired_any = True
        u.fired.add(token)
        if not u.handed and u.fired >= u.nodes:
            # every node of the unit's forwards has accumulated its gradient: hand in now, so
            # the reduction overlaps the rest of the backward (and free the unit unless it
            # stays gathered across this step's no-sync micro-batches, training.accumulation)
            keep = u.policy.keep_gathered and not self._sync
            self._hand_in(u, free=not u.has_frozen and not keep)

    def _hand_in(self, u, free=True):
        if not u.used:  # not run in this pass (a zero gradient): the pass's mode
            u.full_bwd = self._pass_full and u.policy.master_dtype == "fp32"
        if u.full_bwd and not self._sync:
            raise _error("state", "unit %d (%r): an eval-mode backward reduces in full precision "
                         "at once; it cannot run under no_sync()" % (u.index, u.info.path))
        grads = [(p, pi) for p, pi in u.params if p.grad is not None]
        # no gradient: pcs hands in a zero one (a frozen unit takes no block); an eval-mode
        # backward's hand-in is in full precision only with its fp32 buffer
        if grads or (u.full_bwd and any(p.requires_grad for p, _ in u.params)):
            buf = (self.worker.grad_buffer_full(u.index) if u.full_bwd
                   else self.worker.grad_buffer(u.index)).torch()
            for p, pi in grads:
                buf.narrow(0, pi.offset, pi.numel).copy_(p.grad.reshape(-1))
                p.grad = None
        self.worker.hand_in_grads(u.index, self._sync)
        u.handed = True
        u.synced = u.synced or self._sync
        if free:
            self._free(u)

    def _backward_done(self):
        self._callback_queued = False
        self._in_backward = False
        if not self._fired_any and not any(p.grad is not None for u in self.units
                                           for p, _ in u.params):
            # torch.autograd.grad(..., inputs=...) through the model (a gradient penalty): no
            # parameter gradient, nothing to hand in; the backward that follows does
            return
        self._fired_any = False
        for u in self.units:
            pending = any(p.grad is not None for p, _ in u.params)
            keep = u.policy.keep_gathered and not self._sync
            if (u.used and not u.handed) or pending or (self._sync and not u.synced):
                self._hand_in(u, free=not keep)
            elif u.live and u.handed and u.has_frozen and not keep:
                self._free(u)
        for u in self.units:
            # the nodes stay until the unit's next forward: a second backward through a
            # retained graph fires them again and hands the unit in again
            u.handed = u.used = False
            u.fired = set()
            u.fresh = True
            if self._sync and not u.live:
                self._free(u, final=True)  # between uses: master-dtype placeholders

    def scale_loss(self, loss):
        """``loss`` x the loss scale / micro_batches: pcs's gradient is the one of the step's
        mean loss (times the grad scaler's scale with fp16)."""
        return loss * (self.worker.loss_scale / self.worker.micro_batches)

    def backward(self, loss, **kwargs):
        """``scale_loss(loss).backward(**kwargs)``: this micro-batch's gradients, handed in by
        the hooks (reduced unless inside :meth:`no_sync`). If the backward raises, the pass's
        state is reset so that the next forward and backward work (what was handed in before
        the error stays handed in)."""
        try:
            self.scale_loss(loss).backward(**kwargs)
        except BaseException:
            self._abandon_backward()
            raise

    def _abandon_backward(self):
        self._callback_queued = self._in_backward = self._fired_any = False
        for u in self.units:
            u.handed = u.used = False
            u.fired, u.fresh = set(), True

    @contextlib.contextmanager
    def no_sync(self):
        """Micro-batches whose gradients are accumulated, not reduced (the last one of a step
        runs outside). Without it every micro-batch reduces into the sharded gradients
        (FSDP2's default; the job's ``training.gradient_sync: every_micro_batch`` plans it)."""
        prev = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = prev

    def step(self, loss):
        """The optimizer step on the shards (clipping, grad scaler, the job's optimizer) and the
        step report; ``loss`` is this rank's mean loss of the step. Returns a
        :class:`pcs.worker.StepResult`."""
        if not self._in_step:
            raise _error("state", "step() before any forward of this step")
        pending = [u.index for u in self.units if not u.synced]
        if pending:
            raise _error("state",
                         "step(): units %s have no synced backward this step" % pending)
        self._drop_prefetched()
        if self._order_now:
            self._order, self._order_now = self._order_now, []
        for u in self.units:
            self._free(u, final=True)
        r = self.worker.step(loss)
        self._in_step = False
        return r

    def full_parameters(self):
        """Every parameter, unsharded, as {fqn: tensor} copies of the masters (fp32, fp64 ones in
        fp64; a pure low-precision job's in its master dtype): gathers one unit at a time.
        Outside a step."""
        out = {}
        self._drop_prefetched()
        for u in self.units:
            self._free(u, final=True)
            if u.info.param_dtype != u.policy.master_dtype:
                self._gather_full(u)
                views = u.views_m
            else:
                self._gather(u)
                views = u.views
            for (p, pi), v in zip(u.params, views):
                out[pi.fqn] = v.detach().clone()
            self._free(u, final=True)
        return out

    def finish(self, error=None):
        """Leave the job (error None = success) and release the worker. The module keeps its
        empty placeholder parameters: take what you need with full_parameters() first."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._drop_prefetched()
        try:
            self.worker.finish(error)
        finally:
            self.worker.destroy()


def shard(module, coordinator, identity=None, hostname=None, join_timeout_ms=0,
          coll_timeout_ms=0, program=PROGRAM, prefetch=True):
    """Join the next job for ``program`` at ``coordinator`` with ``module``'s current parameter
    values as the initial values (every rank must build the module the same way) and return the
    :class:`ShardedModule`. The module stays on the cpu."""
    params = dict(module.named_parameters())

    def init(fqn, first, n):
        p = params.get(fqn)
        if p is None:
            raise KeyError("the plan's parameter %s is not a parameter of the module" % fqn)
        return p.detach().reshape(-1)[first:first + n].to(torch.float32).contiguous()

    def init64(fqn, first, n):  # units with fp64 masters: the module's values themselves
        p = params.get(fqn)
        if p is None:
            raise KeyError("the plan's parameter %s is not a parameter of the module" % fqn)
        return p.detach().reshape(-1)[first:first + n].to(torch.float64).contiguous()

    w = _w.Worker(coordinator, identity=identity, hostname=hostname,
                  join_timeout_ms=join_timeout_ms, coll_timeout_ms=coll_timeout_ms, init=init,
                  program=program, init64=init64)
    try:
        return ShardedModule(module, w, prefetch=prefetch)
    except BaseException as e:
        try:
            w.finish("pcs.torch: %s" % e)
        except _w.PcsError:
            pass  # the job fails anyway; the first error is the one to see
        finally:
            w.destroy()
        raise
