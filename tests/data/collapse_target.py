"""An RMSNorm over rows split across ranks, its oracle written by hand in the case dtype (a new
user's Llama block, cut down): at values of 10^3 (the option ``scale``, in float16) ``x * x``
overflows float16 to inf, ``rsqrt`` gives 0, and the float16 oracle's outputs are all a finite 0.
``weight_grad_not_reduced`` leaves the norm weight's gradient unreduced (each rank's rows only)."""

import torch
import torch.distributed as dist
from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target, bind
from shardfuzz.spec.inputs import generator, randn

EPS = 1e-6


def inputs(case):
    gen = generator(case)
    rows, d = case.sizes["rows"], case.sizes["d"]
    x = randn(case, rows, d, gen=gen)
    scale = case.options["scale"] if case.dtype == "float16" else 1.0  # 10^3: x * x overflows
    return {"x": x * scale, "w": randn(case, d, gen=gen), "dy": randn(case, rows, d, gen=gen)}


def norm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def oracle(inp, case):
    x, w = inp["x"].requires_grad_(), inp["w"].requires_grad_()
    y = norm(x, w)
    gx, gw = torch.autograd.grad(y, (x, w), inp["dy"])
    return {"y": y, "grad_x": gx, "grad_w": gw}


def reference(ctx, *, reduce_weight_grad=True):
    x, w = ctx.local["x"].clone().requires_grad_(), ctx.inputs["w"].clone().requires_grad_()
    y = norm(x, w)
    gx, gw = torch.autograd.grad(y, (x, w), ctx.local["dy"])
    if reduce_weight_grad:
        dist.all_reduce(gw, group=ctx.group)
    return {"y": y, "grad_x": gx, "grad_w": gw}


TARGET = Target(
    name="collapse_rmsnorm",
    cases=sst.cases(
        "collapse_rmsnorm",
        sizes={"rows": sst.Split(min_per_rank=1, max_per_rank=2), "d": sst.Free(2, 4)},
        min_world=2,
        max_world=2,
        dtypes=("float16", "float32"),
        profiles=("normal",),
        options={"scale": st.sampled_from([1e3, 1.0])},
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"y": Shard(0), "grad_x": Shard(0), "grad_w": Replicate()},
    input_layouts={"x": Shard(0), "dy": Shard(0)},
    implementations={
        "reference": reference,
        "weight_grad_not_reduced": bind(reference, reduce_weight_grad=False),
    },
)

#: the same, with the implementation at world size 1 as its oracle (``docs/how-to/no-oracle.md``)
SELF_TARGET = TARGET.derive("collapse_rmsnorm_self", oracle="self")


def oracle_in_place(inp, case):
    """The same norm, its square taken in place."""
    x, w = inp["x"].requires_grad_(), inp["w"].requires_grad_()
    sq = x.clone()
    sq.mul_(x)
    y = x * torch.rsqrt(sq.mean(-1, keepdim=True) + EPS) * w
    gx, gw = torch.autograd.grad(y, (x, w), inp["dy"])
    return {"y": y, "grad_x": gx, "grad_w": gw}


INPLACE_TARGET = TARGET.derive("collapse_rmsnorm_inplace", oracle=oracle_in_place)


def oracle_dropped(inp, case):
    """The same norm, a random half of its outputs dropped (drawn from torch's global generator)."""
    out = oracle(inp, case)
    keep = (torch.rand(out["y"].shape) > 0.5).to(out["y"].dtype)
    return {**out, "y": out["y"] * keep}


DROPPED_TARGET = TARGET.derive("collapse_rmsnorm_dropped", oracle=oracle_dropped)


def _stepped(x, w, dy, group=None):
    """``w`` stepped by its gradient of ``sum(x * w * dy)``, unless the gradient's square overflows:
    a loss scaler's skip, decided in Python (a new user's ZeRO step)."""
    g = (x * dy).sum(0)
    if group is not None:
        dist.all_reduce(g, group=group)
    overflow = not bool(torch.isfinite((g * g).sum()))
    return {"w_new": w if overflow else w - 0.1 * g}


def oracle_stepped(inp, case):
    return _stepped(inp["x"], inp["w"], inp["dy"])


def stepped(ctx):
    return _stepped(ctx.local["x"], ctx.inputs["w"], ctx.local["dy"], ctx.group)


#: at scale 10^3 in float16 the squared gradient overflows: the case-dtype oracle (and the ranks)
#: skip the step, where the float64 oracle takes it; nothing the outputs hold came from the inf
SKIP_TARGET = TARGET.derive(
    "collapse_skipped_step",
    oracle=oracle_stepped,
    outputs={"w_new": Replicate()},
    implementations={"reference": stepped},
)


def _skip_flag(x, dy, group=None):
    """Whether a loss scaler skips the step: the gradient's square overflows (decided in Python)."""
    g = (x * dy).sum(0)
    if group is not None:
        dist.all_reduce(g, group=group)
    return {"skipped": torch.tensor([int(not bool(torch.isfinite((g * g).sum())))])}


def oracle_skip_flag(inp, case):
    return _skip_flag(inp["x"], inp["dy"])


def skip_flag(ctx):
    return _skip_flag(ctx.local["x"], ctx.local["dy"], ctx.group)


#: only the skip flag, compared exactly: 1 in float16 at scale 10^3 (on the ranks and in the
#: oracle's float16 run), 0 in float64
FLAG_TARGET = TARGET.derive(
    "collapse_skip_flag",
    oracle=oracle_skip_flag,
    outputs={"skipped": Replicate()},
    implementations={"reference": skip_flag},
)
