"""The seeds' models and the cases pcs.torch is tested on, shared by the test (tests/python/
test_pcs_torch.py: submits the job, starts the ranks, trains the plain PyTorch reference and
compares) and by each rank (tests/python/rank.py).

Models (PyTorch's torch/testing/_internal/common_fsdp.py and test_fsdp_mixed_precision.py):
NestedWrappedModule, BatchNormNet, a small transformer-like module with a tied embedding, a
module with an external input, one with its own cast, one with a frozen submodule.

Data: every step's global micro-batch (dp_size x micro_batch_size rows) is drawn from a seeded
generator, so each rank takes its rows and the reference takes all of them.
"""

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


# ---- models ------------------------------------------------------------------------------------

class NestedWrappedModule(nn.Module):
    """common_fsdp.NestedWrappedModule: units module.1.0, module.1, module.2 and the root."""

    WRAP = ["module.1.0", "module.1", "module.2"]

    def __init__(self):
        super().__init__()
        self.module = nn.Sequential(
            nn.Linear(8, 4),
            nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 16)),
            nn.Linear(16, 4),
            nn.Linear(4, 8),
        )

    def forward(self, x):
        return self.module(x)


class BatchNormNet(nn.Module):
    """test_fsdp_mixed_precision.BatchNormNet: BatchNorm1d is an ignored class (its own unit,
    full precision) under mixed precision."""

    WRAP = ["fc2"]

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 40, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.fc2 = nn.Linear(40, 4, bias=False)

    def forward(self, x):
        x = torch.reshape(self.fc1(x), (-1, 4, 10))
        x = self.bn(x)
        x = torch.reshape(x, (-1, 40))
        return F.softmax(self.fc2(x), dim=1)


class TiedLM(nn.Module):
    """A transformer-like module whose output projection is the embedding (tied weights, as
    TransformerWithSharedParams): the plan keeps the shared weight in the root unit."""

    WRAP = ["block"]
    VOCAB, DIM = 24, 16

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, self.DIM)
        self.block = nn.Sequential(nn.Linear(self.DIM, 32), nn.GELU(), nn.Linear(32, self.DIM))
        self.norm = nn.LayerNorm(self.DIM)
        self.head = nn.Linear(self.DIM, self.VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.block(h)
        return self.head(self.norm(h))


class ExternalInput(nn.Module):
    """A module whose forward takes a second, external tensor (FSDP's 'external inputs')."""

    WRAP = ["a", "b"]

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x, scale):
        return self.b(torch.tanh(self.a(x)) * scale)


class OwnCast(nn.Module):
    """A module that casts inside its own forward (the activations go to float32 between the two
    units, whatever the precision: the next unit's input cast brings them to its param dtype),
    with a floating buffer of its own (kept in buffer_dtype)."""

    WRAP = ["inner", "out"]

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)
        self.inner.register_buffer("shift", torch.linspace(-0.2, 0.2, 8))

    def forward(self, x):
        h = torch.relu(self.inner(x) + self.inner.shift)
        return self.out(h.float())


class Frozen(nn.Module):
    """A frozen first layer (requires_grad False): pcs must leave it unchanged."""

    WRAP = ["frozen", "trained"]

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(8, 8)
        self.trained = nn.Linear(8, 4)
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.trained(torch.relu(self.frozen(x)))


class Twice(nn.Module):
    """A unit called twice in one forward (weight sharing across depth): under mixed precision
    with reshard-after-forward its parameters change dtype between the calls, and PyTorch gives
    each call its own AccumulateGrad node."""

    WRAP = ["shared", "out"]

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.shared(torch.tanh(self.shared(x)))))


class LoraLinear(nn.Module):
    """A frozen base Linear and a trainable low-rank adapter; `base_dtype` bf16: the base in
    bf16 (the QLoRA shape: a group of mixed dtypes), computing on its input cast to it and
    handing its output back in the input's dtype; `train_base`: the base trains too."""

    def __init__(self, base_dtype=None, train_base=False):
        super().__init__()
        self.base = nn.Linear(8, 8)
        self.a = nn.Linear(8, 2, bias=False)
        self.b = nn.Linear(2, 8, bias=False)
        if base_dtype is not None:
            self.base.to(base_dtype)
        for p in self.base.parameters():
            p.requires_grad_(train_base)

    def forward(self, x):
        dt = self.base.weight.dtype
        return self.base(x.to(dt)).to(x.dtype) + self.b(self.a(x))


class Lora(nn.Module):
    """A unit with frozen and trainable parameters (LoRA): the frozen weight is still needed for
    the input gradient after the trainable ones' gradients are in."""

    WRAP = ["adapter"]

    def __init__(self, **adapter):
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.adapter = LoraLinear(**adapter)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.adapter(torch.relu(self.pre(x)))))


class LoraBf16Base(Lora):
    """Lora with its base Linear in bf16 (frozen): the adapter unit mixes dtypes."""

    def __init__(self):
        super().__init__(base_dtype=torch.bfloat16)


class LoraBf16BaseTrained(Lora):
    """LoraBf16Base with the bf16 base trained too."""

    def __init__(self):
        super().__init__(base_dtype=torch.bfloat16, train_base=True)


class Bf16Blocks(nn.Module):
    """Two wrapped bf16 Linear blocks in a row inside an fp32 model, frozen, with no mixed
    precision: each hands the next its bf16 output (no cast between units, as FSDP2)."""

    WRAP = ["l0", "l1"]

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.l0 = nn.Linear(8, 8).to(torch.bfloat16)
        self.l1 = nn.Linear(8, 8).to(torch.bfloat16)
        self.head = nn.Linear(8, 4)
        for p in list(self.l0.parameters()) + list(self.l1.parameters()):
            p.requires_grad_(False)

    def forward(self, x):
        h = self.l1(torch.relu(self.l0(torch.relu(self.pre(x)).to(torch.bfloat16))))
        return self.head(h.float())


class Checkpointed(nn.Module):
    """A unit run under non-reentrant activation checkpointing: its forward runs again inside
    the backward (and, with reshard-after-forward, must find the unit still gathered)."""

    WRAP = ["block"]

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
        return self.head(torch.relu(h))


MODELS = {"nested": NestedWrappedModule, "batchnorm": BatchNormNet, "tied": TiedLM,
          "external": ExternalInput, "owncast": OwnCast, "frozen": Frozen, "twice": Twice,
          "lora": Lora, "ckpt": Checkpointed,
          "lora_bf16base": LoraBf16Base, "lora_bf16base_trained": LoraBf16BaseTrained,
          "bf16blocks": Bf16Blocks}


def build(name, seed=1234):
    torch.manual_seed(seed)
    return MODELS[name]()


def build_case(case_name):
    """The model of case `case_name` in the dtype the case builds it in (the seeds'
    full_precision_param_dtype: float64 for the fp64 rows)."""
    c = CASES[case_name]
    m = build(c["model"])
    return m.to(c["model_dtype"]) if c.get("model_dtype") else m


# ---- data and loss -----------------------------------------------------------------------------

def batch(name, step, mb, rows):
    """Global micro-batch `mb` of `step`: (inputs tuple, target)."""
    g = torch.Generator().manual_seed(1000003 * (step + 1) + 7919 * mb)
    if name == "tied":
        tokens = torch.randint(0, TiedLM.VOCAB, (rows, 6), generator=g)
        return (tokens,), torch.roll(tokens, -1, dims=1)
    if name == "batchnorm":
        return (torch.rand(rows, 2, generator=g),), torch.rand(rows, 4, generator=g)
    x = torch.rand(rows, 8, generator=g)
    if name == "external":
        return (x, torch.rand(rows, 1, generator=g) + 0.5), torch.rand(rows, 4, generator=g)
    if name == "nested":
        return (x,), torch.rand(rows, 8, generator=g)
    return (x,), torch.rand(rows, 4, generator=g)


def loss_fn(name, out, target):
    """In fp32, or fp64 for a model computing in fp64 (the target in the same dtype)."""
    o = out if out.dtype == torch.float64 else out.float()
    if name == "tied":
        return F.cross_entropy(o.reshape(-1, TiedLM.VOCAB), target.reshape(-1))
    return F.mse_loss(o, target.to(o.dtype))


# ---- cases -------------------------------------------------------------------------------------

OPT = {"adamw": {"lr": 0.01, "weight_decay": 0.01}}
SGD = {"sgd": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.001}}
BASE = {"strategy": "full_shard", "mesh": [{"dim": "dp_shard", "size": 2}]}


def case(model, precision=None, steps=4, micro_batches=2, mbs=4, clip=None, data=None,
         opt=None, split_loss=False, eval_each_step=False, full_precision_eval=False,
         accumulation=None, eval_backward=False, **extra):
    training = {"steps": steps, "micro_batch_size": mbs, "micro_batches": micro_batches,
                "optimizer": opt or OPT}
    if accumulation:
        training["accumulation"] = accumulation
    if full_precision_eval:
        training["full_precision_eval"] = True
    if eval_backward:
        training["eval_backward"] = True
    if clip:
        training["clip_grad_norm"] = clip
    c = {"model": model, "precision": precision or {}, "training": training, "data": data,
         "split_loss": split_loss, "eval": eval_each_step}
    c.update(extra)
    return c


CASES = {
    # fp32: the reference is plain single-process PyTorch on the global batch (tight)
    # with a no_grad eval forward after every step (it opens no step, frees what it gathers)
    "nested_fp32": case("nested", clip=1.0, eval_each_step=True),
    # two backward calls per micro-batch (two losses, the graph retained for the second)
    "split_fp32": case("nested", opt=SGD, split_loss=True),
    "lora_fp32": case("lora", opt=SGD),
    "lora_fp32_per_param": case("lora", opt=SGD, layout="per_param"),
    "ckpt_fp32": case("ckpt", opt=SGD),
    # training.accumulation keep_gathered: units stay gathered across the no-sync micro-batches
    "keep_fp32": case("nested", opt=SGD, micro_batches=3, accumulation="keep_gathered"),
    "tied_fp32": case("tied"),
    # FSDP2's per-parameter layout (shard_layout: per_param): other elements on each rank, the
    # same numbers; with a placement on dim 1 for the block's first Linear
    "tied_fp32_per_param": case("tied", layout="per_param"),
    # training.eval_backward (FSDP_USE_FULL_PREC_IN_EVAL): every step's backward runs in eval
    # mode, so in full precision — fp32 compute on the gathered masters and fp32 reductions
    # whatever the policy says (bf16 compute; fp16 reduce, seed test_full_precision_in_eval_comm)
    "nested_evalbwd_bf16": case("nested", {"param_dtype": "bf16"}, opt=SGD, micro_batches=1,
                                full_precision_eval=True, eval_backward=True, eval_train=True),
    "nested_evalbwd_fp16_reduce": case("nested", {"reduce_dtype": "fp16"}, opt=SGD,
                                       micro_batches=1, full_precision_eval=True,
                                       eval_backward=True, eval_train=True),
    "nested_fp32_per_param": case("nested", clip=1.0, layout="per_param",
                                  placements=[{"param": "module.1.1.weight", "dim": 1}]),
    "external_fp32": case("external", opt=SGD),
    "owncast_fp32": case("owncast", opt=SGD),
    "frozen_fp32": case("frozen", opt=SGD),
    # mixed precision (FSDP1 MixedPrecision(param bf16, reduce fp32, buffer bf16)); the reference
    # runs each rank's micro-batch in bf16 and reduces in fp32 (the seeds' tolerances)
    "nested_bf16": case("nested", {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                   "buffer_dtype": "bf16"}, clip=0.05),
    # FSDP2 output_dtype: every unit hands its floating outputs on in fp32
    "external_bf16_out32": case("external", {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                             "output_dtype": "fp32"}, opt=SGD),
    "twice_bf16": case("twice", {"param_dtype": "bf16", "reduce_dtype": "fp32"}, opt=SGD),
    # FSDP_USE_FULL_PREC_IN_EVAL: eval forwards on the fp32 masters, buffers in their own dtype
    "owncast_bf16_fulleval": case("owncast", {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                              "buffer_dtype": "bf16"},
                                  eval_each_step=True, full_precision_eval=True),
    "owncast_bf16": case("owncast", {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                     "buffer_dtype": "bf16"}),
    "batchnorm_bf16": case("batchnorm", {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                         "buffer_dtype": "bf16"}, opt=SGD),
    # pure low precision (test_fsdp_pure_fp16: the model .half(), inputs cast by the loop, one
    # step). torch 1.13 has no fp16 matmul on the cpu ("addmm_impl_cpu_" not implemented for
    # 'Half'), so the cpu test runs the case with bf16 masters; fp16 needs a cuda job.
    "nested_pure_bf16": case("nested", {"master_dtype": "bf16"}, steps=1, micro_batches=1,
                             data=torch.bfloat16),
    # fp64 masters (test_fsdp_mixed_precision's full_precision_param_dtype=torch.float64 rows:
    # the model and its inputs in float64): no mixed precision (fp64 compute and reductions),
    # mp_only_reduce (fp64 compute, fp16 reductions; the no-sync micro-batches accumulate in fp16,
    # spec 4.1 step 7), and param/reduce/buffer low precision (bf16: torch 1.13 has no fp16 matmul
    # on the cpu)
    "nested_fp64": case("nested", {"master_dtype": "fp64"}, data=torch.float64,
                        model_dtype=torch.float64),
    "nested_fp64_fp16_reduce": case("nested", {"master_dtype": "fp64", "reduce_dtype": "fp16"},
                                    data=torch.float64, model_dtype=torch.float64),
    "nested_fp64_bf16": case("nested", {"master_dtype": "fp64", "param_dtype": "bf16",
                                        "reduce_dtype": "fp32", "buffer_dtype": "bf16"},
                             data=torch.float64, model_dtype=torch.float64),
    # FSDP2 ignored_params: a wrapped Linear's bias and a root-unit Linear's weight stay whole,
    # uncast and unreduced on every rank; under bf16 the uncast bias fails the forward
    "nested_ignored_fp32": case("nested", ignored=["module.2.bias", "module.0.weight"]),
    "nested_ignored_bf16": case("nested", {"param_dtype": "bf16", "reduce_dtype": "fp32"},
                                ignored=["module.2.bias"], steps=1),
    # FSDP2 groups of mixed dtypes (a bf16 base Linear beside fp32 adapters in one unit; FSDP2
    # all-gathers such a group as uint8, pcs as one unit per dtype): no mixed precision, the
    # base frozen (the QLoRA shape); and the base trained too, which FSDP2 and pcs refuse
    "lora_bf16base_per_param": case("lora_bf16base", layout="per_param"),
    "lora_bf16base_no_shard": case("lora_bf16base", layout="per_param", strategy="no_shard"),
    "bf16blocks_fp32": case("bf16blocks", opt=SGD),
    "lora_bf16base_trained_bf16": case("lora_bf16base_trained",
                                       {"param_dtype": "bf16", "reduce_dtype": "fp32"},
                                       opt=SGD, steps=2, layout="per_param"),
}


def eval_batch(name, rows):
    """The held-out batch evaluated after every step (eval_each_step cases)."""
    return batch(name, 10**6, 0, rows)


def split_losses(name, out, target):
    """The two losses of a split_loss case (their sum is loss_fn's value times 2)."""
    return (F.mse_loss(out[:, :4].float(), target[:, :4]),
            F.mse_loss(out[:, 4:].float(), target[:, 4:]))


def data_dtype(name):
    """The dtype the training loop gives the model its floating inputs in (None: as drawn)."""
    return CASES[name]["data"]


def job(name):
    """(model name, the job spec's sections but `model` and `program`) of case `name`."""
    c = CASES[name]
    m = build(c["model"])
    spec = {"name": "pcs-torch-" + name.replace("_", "-"), "wrap": {"explicit": {"paths":
                                                                               m.WRAP}},
            "training": c["training"], **BASE}
    if c["precision"]:
        spec["precision"] = c["precision"]
    if c.get("layout"):
        spec["shard_layout"] = c["layout"]
    if c.get("placements"):
        spec["shard_placements"] = c["placements"]
    if c.get("ignored"):
        spec["ignored_params"] = c["ignored"]
    if c.get("strategy"):
        spec["strategy"] = c["strategy"]
    return c["model"], spec
