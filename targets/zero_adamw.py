"""ZeRO-sharded AdamW (stages 1, 2 and 3) against ``torch.optim.AdamW`` in one process.

The "model" is a flat buffer of ``numel`` elements (drawn relative to the group, so the group
rarely divides it and small buffers on 3-4 ranks put padding on several ranks) cut into
``min(3, numel)`` parameters. Gradients are deterministic per step from the seed: each rank ``r``
and micro-batch ``m`` of step ``t`` has the quadratic loss
``0.5 * sum(a[t, m, r] * (p - x[t, m, r]) ** 2) / (grad_accum * G)``, so the gradient depends on
the current parameters (stage 3 must gather them right) and the global gradient is the mean over
ranks and micro-batches. Optional global-norm clipping uses ``max_norm = clip_factor * |g_1|``
(the norm of the first step's true gradient, computed by the inputs builder in float64), so with
``clip_factor=0.5`` the clip is really active. AdamW: lr 0.1, betas (0.9, 0.999), eps 1e-8,
weight decay 0.1. Options: ``stage`` (1, 2, 3) and ``clip_factor`` (None, 0.5), then, after dtype
and profile, ``steps`` (1-3) and ``grad_accum`` (1-2).

Flat ZeRO (``reference``): the flat buffer is padded to a multiple of the group size ``G`` and
split evenly (``c = ceil(n / G)`` elements per rank, padding on the last rank(s)). Padding is
uninitialised memory: we fill it with NaN, as ``torch.utils.deterministic.fill_uninitialized_memory``
does, so an implementation that reads it shows. Each rank keeps its shard of the master parameters
and of ``exp_avg``/``exp_avg_sq`` plus one step counter. Per step:

* stage 3 all-gathers the parameter shards to use them; stages 1 and 2 keep full parameters,
  refreshed by an all-gather after each step;
* stage 1 accumulates full gradients over the micro-batches and all-reduces them once, then each
  rank takes its shard; stages 2 and 3 reduce-scatter the padded gradient after each micro-batch
  and accumulate the shard;
* clipping all-reduces the squared norm of the real (non-padding) elements;
* the AdamW update (``torch.optim.AdamW``'s single-tensor arithmetic) runs on the shard.

Outputs after every step (``[steps, n]``, one row per step): ``param``, ``exp_avg`` and
``exp_avg_sq`` as :class:`StepwisePaddedFlat` (``PaddedFlat()`` row by row: padding never
compared), and the step counter ``step`` (``[steps]`` int64, replicated, compared exactly). The
oracle is ``torch.optim.AdamW`` (with ``torch.nn.utils.clip_grad_norm_``) on the unsharded
parameters, in the case dtype (bf16 keeps bf16 state, as torch does, and so does the reference).
The collectives are built on ``all_to_all_single`` (:mod:`shardfuzz.spec.parallel`: on gloo with 2
cores it is several times faster than the dedicated ones).

Planted bugs: the ``PLANTED`` records at the end of this file (each a small change to the
reference, modelled on a real bug).

A second target in this module, ``zero_adamw_torch`` (:data:`TORCH_TARGET`), fuzzes torch's own
ZeRO code around AdamW, with three parameters ``i`` = 0, 1, 2 of sizes ``p0``-``p2``; its outputs
are per parameter, after every step: ``param_i``, ``exp_avg_i``, ``exp_avg_sq_i`` (``[steps,
p_i]``) and ``step_i`` (``[steps]``). The option ``empty_param`` (rare) gives parameter 1 no
elements. Its implementations:

* ``torch.distributed.optim.ZeroRedundancyOptimizer`` (the reference): it gives whole parameters
  to owner ranks and does not reduce gradients, so the wrapper all-reduces them (sum of the
  per-rank ``loss / (grad_accum * G)`` gradients: the mean) and clips outside it. Its parameters
  are compared on every rank (``Replicate()``) and its state on the owner (``Owned()``); option
  ``bucket_view`` sets ``parameters_as_bucket_view``. The step counts are float32 there (torch's
  own dtype for ``state["step"]``): whole numbers, so a wrong count is far outside any tolerance;
  the engine compares integer ``Owned()`` outputs on non-owners too.
* FSDP2 (``fsdp2``, ``fsdp2_hsdp``; :mod:`shardfuzz.targets.zero_fsdp2`): each parameter sharded
  ``Shard(0)``; the state comes back as DTensors, whose placements replace the declared layouts.

It is a second target rather than a second implementation of ``zero_adamw`` because its state is
per parameter, which the flat layouts cannot describe (and ``zero_adamw``'s flat buffer has no
fixed parameter count).
"""

from __future__ import annotations

import dataclasses
import math

import hypothesis.strategies as st
import torch

import shardfuzz.strategies as sst
from shardfuzz import (
    CommBudget,
    Expect,
    ExpectedFailure,
    Owned,
    PaddedFlat,
    PlantedBug,
    Replicate,
    Target,
    Verified,
    bind,
)
from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.budget import ITEMSIZE
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_sizes
from shardfuzz.spec.parallel import (
    all_gather_by_all_to_all,
    all_reduce_by_all_to_all,
    reduce_scatter_by_all_to_all,
)

LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 0.1, 0.9, 0.999, 1e-8, 0.1
LOSS_SCALE = 65536.0  # DeepSpeed's initial dynamic loss scale
N_PARAMS = 3
PARAMS = tuple(f"p{i}" for i in range(N_PARAMS))

# the flat buffer is split over the group, so its size is drawn relative to it: per_rank * G +
# remainder, with "fewer elements than ranks" (per_rank 0) allowed; it is cut into min(3, numel)
# parameters (tensor_split rule). Small buffers on 3-4 ranks put padding on several ranks.
SIZES = {"numel": sst.Split(min_per_rank=0, max_per_rank=3, allow_empty=True)}
# ZeroRedundancyOptimizer's per-parameter outputs need a fixed number of parameters
TORCH_SIZES = {name: sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True) for name in PARAMS}
LATE = {"steps": st.integers(1, 3), "grad_accum": st.integers(1, 2)}
CLIP = st.sampled_from([None, 0.5])


def cases(world_sizes=None):
    return sst.cases(
        "zero_adamw",
        sizes=SIZES,
        options={"stage": st.sampled_from([1, 2, 3]), "clip_factor": CLIP},
        late_options=LATE,
        world_sizes=world_sizes,
    )


def torch_cases(world_sizes=None):
    return sst.cases(
        "zero_adamw_torch",
        sizes=TORCH_SIZES,
        # empty_param (rare): parameter p1 has no elements, whatever its drawn size
        options={"clip_factor": CLIP, "bucket_view": st.booleans(), "empty_param": sst.mostly(False, True)},
        late_options=LATE,
        world_sizes=world_sizes,
    )


@dataclasses.dataclass(frozen=True)
class StepwisePaddedFlat(PaddedFlat):
    """``PaddedFlat()`` applied to every row of a ``[steps, n]`` value (one flat buffer per step).

    Rank ``i`` holds ``[steps, ceil(n / parts)]``; the padding at the end of the last shard(s) is
    never compared.
    """

    def __repr__(self) -> str:
        return "StepwisePaddedFlat()"

    def local_shape(self, global_shape, rank, parts):
        if len(global_shape) != 2:
            raise InvalidArgument(f"StepwisePaddedFlat() needs a [steps, n] value, got {tuple(global_shape)}")
        return (global_shape[0], self._chunk(global_shape[1], parts))

    def piece(self, value, rank, parts):
        start, k = self._valid(value.shape[1], rank, parts)
        return value[:, start : start + k]

    def comparable(self, local, rank, parts, global_shape):
        _, k = self._valid(global_shape[1], rank, parts)
        return local[:, :k]

    def assemble(self, locals_):
        return torch.cat(list(locals_), dim=1)

    def global_index(self, local_index, rank, parts, global_shape):
        start, _ = self._valid(global_shape[1], rank, parts)
        return (local_index[0], local_index[1] + start)


def param_sizes(case) -> list[int]:
    if "numel" in case.sizes:
        n = case.sizes["numel"]
        return split_sizes(n, min(N_PARAMS, n), "tensor_split")
    sizes = [case.sizes[name] for name in PARAMS]
    if case.options.get("empty_param"):
        sizes[1] = 0
    return sizes


def _mean_grad(p, a, x, group_size):
    """The global gradient of one step (float64 helper for the inputs builder and the bounds)."""
    return (a * (p - x)).sum((0, 1)) / (a.shape[0] * group_size)


def inputs(case):
    n = sum(param_sizes(case))
    steps, accum, g_size = case.options["steps"], case.options["grad_accum"], case.group_size
    g = generator(case)
    inp = {
        "p0": randn(case, n, gen=g),
        "a": randn(case, steps, accum, g_size, n, gen=g, profile=False),
        "x": randn(case, steps, accum, g_size, n, gen=g),
    }
    factor = case.options["clip_factor"]
    if factor is None:
        inp["max_norm"] = None
    else:  # a plain float, identical everywhere: computed in float64 from the rounded inputs
        g1 = _mean_grad(inp["p0"].double(), inp["a"][0].double(), inp["x"][0].double(), g_size)
        inp["max_norm"] = float(factor * g1.norm())
    return inp


def oracle(inp, case):
    sizes = param_sizes(case)
    steps, accum, g_size = case.options["steps"], case.options["grad_accum"], case.group_size
    params = [torch.nn.Parameter(t.clone()) for t in inp["p0"].split(sizes)]
    opt = torch.optim.AdamW(
        params, lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY, foreach=False
    )
    rows = {k: [] for k in ("param", "exp_avg", "exp_avg_sq")}
    per_param = {
        f"{k}_{i}": [] for k in ("param", "exp_avg", "exp_avg_sq", "step") for i in range(len(sizes))
    }
    counts = []
    for t in range(steps):
        opt.zero_grad()
        p = torch.cat(params)
        loss = (0.5 * inp["a"][t] * (p - inp["x"][t]) ** 2).sum() / (accum * g_size)
        loss.backward()
        if inp["max_norm"] is not None:
            torch.nn.utils.clip_grad_norm_(params, inp["max_norm"], foreach=False)
        opt.step()
        states = [opt.state[q] for q in params]
        rows["param"].append(torch.cat([q.detach() for q in params]))
        for i, q in enumerate(params):
            per_param[f"param_{i}"].append(q.detach().clone())
        for k in ("exp_avg", "exp_avg_sq"):
            rows[k].append(torch.cat([s[k] for s in states]))
            for i, s in enumerate(states):
                per_param[f"{k}_{i}"].append(s[k].clone())
        for i, s in enumerate(states):
            per_param[f"step_{i}"].append(s["step"].reshape(1).float())
        counts.append(int(states[0]["step"]))
    out = {k: torch.stack(v) for k, v in rows.items()}
    out["step"] = torch.tensor(counts, dtype=torch.int64)
    for k, v in per_param.items():
        out[k] = torch.cat(v) if k.startswith("step_") else torch.stack(v)
    return out


def _update_bound(t: int) -> float:
    """Largest |AdamW update| (before lr) any gradient sequence can give at step t (Cauchy-Schwarz)."""
    ratio = (BETA1**2 / BETA2) ** torch.arange(t, dtype=torch.float64)
    m_over_sqrt_v = (1 - BETA1) / math.sqrt(1 - BETA2) * float(ratio.sum().sqrt())
    return m_over_sqrt_v * math.sqrt(1 - BETA2**t) / (1 - BETA1**t)


# -- the flat ZeRO implementation ------------------------------------------------------------------
def _real_count(n: int, rank: int, parts: int, chunk: int, bug: str | None) -> int:
    """How many real (non-padding) elements rank ``rank``'s shard of ``chunk`` elements holds."""
    if bug == "padding_on_last_rank":  # deepspeedai/DeepSpeed#6974: only the last rank pads
        return chunk - (chunk * parts - n) if rank == parts - 1 else chunk
    return max(0, min(chunk, n - rank * chunk))


def _adamw_(param, grad, exp_avg, exp_avg_sq, step: int, bug: str | None = None) -> None:
    """``torch.optim.AdamW``'s single-tensor update, in place on a shard."""
    param.mul_(1 - LR * WEIGHT_DECAY)
    exp_avg.lerp_(grad, 1 - BETA1)
    exp_avg_sq.mul_(BETA2).addcmul_(grad, grad, value=1 - BETA2)
    if bug == "bf16_step_tensor" and param.dtype == torch.bfloat16:
        # the step kept as a tensor in the parameter dtype: beta2 is promoted to bf16 (0.999 rounds
        # to 1.0), so 1 - beta2 ** step is 0, the denominator inf and the Adam update vanishes
        t = torch.tensor(step, dtype=param.dtype)
        bias_correction1, bias_correction2 = 1 - BETA1**t, 1 - BETA2**t
        denom = (exp_avg_sq.sqrt() / bias_correction2.sqrt()).add_(EPS)
        param.addcdiv_(exp_avg, denom, value=float(-LR / bias_correction1))
        return
    bias_correction1 = 1 - BETA1**step
    bias_correction2 = 1 - BETA2**step
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(EPS)
    param.addcdiv_(exp_avg, denom, value=-LR / bias_correction1)


def reference(ctx, *, bug: str | None = None):
    """Flat ZeRO AdamW, stages 1-3; ``bug`` plants one of the ``PLANTED`` bugs.

    Each step: stage 3 gathers the parameters; the micro-batches' gradients are reduced as the stage
    does (:func:`_reduced_slice`, :func:`_gradient_shard`); the gradient is clipped by the global
    norm (:func:`_clip_`); AdamW updates this rank's shard (:func:`_adamw_`); stages 1 and 2
    gather the updated parameters for the next step."""
    opts = ctx.case.options
    stage, steps, accum = opts["stage"], opts["steps"], opts["grad_accum"]
    group, rank, g_size = ctx.group, ctx.group_rank, ctx.group_size
    p0, max_norm = ctx.inputs["p0"], ctx.inputs["max_norm"]
    a, x = ctx.inputs["a"][:, :, rank], ctx.inputs["x"][:, :, rank]
    dtype = p0.dtype
    n = p0.numel()
    chunk = -(-n // g_size)
    lo = rank * chunk
    real = (lo + torch.arange(chunk)) < n  # which elements of my shard are real (not padding)
    k = _real_count(n, rank, g_size, chunk, bug)
    master = torch.cat([p0.narrow(0, min(lo, n), k), p0.new_full((chunk - k,), math.nan)])
    exp_avg, exp_avg_sq = torch.zeros_like(master), torch.zeros_like(master)
    step = 0
    if bug == "init_step":  # materialise the state with a zero-gradient, zero-lr step: step -> 1
        step += 1
    full = None if stage == 3 else p0.clone()
    grad_full = torch.zeros(n, dtype=dtype)  # stage 1: local accumulation of full gradients
    grad_shard = torch.zeros(chunk, dtype=dtype)  # stages 2 and 3: accumulated reduced shard
    rows = {k: [] for k in ("param", "exp_avg", "exp_avg_sq")}
    counts = []
    for t in range(steps):
        if stage == 3:  # parameters are sharded: gather them for use
            full = all_gather_by_all_to_all(master, group, g_size)[:n]
        if not (bug == "grads_not_zeroed" and t > 0):
            grad_full.zero_()
            grad_shard.zero_()
        p = full.clone().requires_grad_()
        for mb in range(accum):
            loss = (0.5 * a[t, mb] * (p - x[t, mb]) ** 2).sum() / (accum * g_size)
            (grad,) = torch.autograd.grad(loss, p)
            if stage == 1:
                grad_full += grad
            else:  # stages 2 and 3: my slice of the reduced gradient, every micro-batch
                grad_shard += _reduced_slice(grad, mb, lo, chunk, group, g_size, bug)
        g = _gradient_shard(stage, grad_full, grad_shard, lo, n, k, chunk, group, g_size)
        if bug == "unscale_unscaled" and dtype == torch.bfloat16:  # the loss was never scaled
            g.div_(LOSS_SCALE)
        if max_norm is not None:
            _clip_(g, max_norm, real, dtype, group, g_size, bug)
        step += 1
        _adamw_(master, g, exp_avg, exp_avg_sq, step, bug)
        if stage != 3 and t + 1 < steps:  # refresh the full parameters for the next step
            full = all_gather_by_all_to_all(master, group, g_size)[:n]
        rows["param"].append(master.clone())
        rows["exp_avg"].append(exp_avg.clone())
        rows["exp_avg_sq"].append(exp_avg_sq.clone())
        counts.append(step)
    out = {k: torch.stack(v) for k, v in rows.items()}
    out["step"] = torch.tensor(counts, dtype=torch.int64)
    return out


def _padded(flat, chunk: int, parts: int):
    """``flat`` padded to ``chunk * parts`` elements. The padding is uninitialised memory: NaN, never
    to be read."""
    buf = flat.new_full((chunk * parts,), math.nan)
    buf[: flat.numel()] = flat
    return buf


def _reduced_slice(grad, mb: int, lo: int, chunk: int, group, g_size: int, bug: str | None):
    """Stages 2 and 3: this rank's slice (``chunk`` elements from ``lo``) of one micro-batch's
    gradient summed over the ranks, by a reduce-scatter of the padded gradient."""
    if bug == "stage2_accum_unreduced" and mb > 0:  # reduce-scatter dispatched once
        return _padded(grad, chunk, g_size).narrow(0, lo, chunk)  # my slice of my own gradient only
    if bug == "reduce_scatter_as_all_reduce":  # the whole reduced gradient, then my slice
        return all_reduce_by_all_to_all(_padded(grad, chunk, g_size), group, g_size).narrow(0, lo, chunk)
    return reduce_scatter_by_all_to_all(_padded(grad, chunk, g_size), group, g_size)  # the contract


def _gradient_shard(
    stage: int, grad_full, grad_shard, lo: int, n: int, k: int, chunk: int, group, g_size: int
):
    """The gradient this rank's shard is updated with: stage 1 all-reduces the accumulated full
    gradient once and takes its ``k`` real elements from ``lo`` (padding NaN); stages 2 and 3 have
    accumulated their reduced shard already."""
    if stage == 1:
        reduced = all_reduce_by_all_to_all(grad_full, group, g_size)
        mine = reduced.narrow(0, min(lo, n), k)
        return torch.cat([mine, reduced.new_full((chunk - k,), math.nan)])
    return grad_shard.clone()


def _clip_(g, max_norm: float, real, dtype, group, g_size: int, bug: str | None) -> None:
    """Global-norm clipping, in place on a gradient shard: the squared norm of the real (not
    padding) elements, summed over the ranks in float32 (float64 for float64)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    sq = g.to(acc) ** 2
    sumsq = sq.sum() if bug == "padding_in_norm" else sq[real].sum()
    if bug != "local_grad_norm":
        sumsq = all_reduce_by_all_to_all(sumsq, group, g_size)
    coef = (max_norm / (sumsq.sqrt() + 1e-6)).clamp(max=1.0)
    g.mul_(coef.to(dtype))


# -- torch's ZeroRedundancyOptimizer ------------------------------------------------------------
def zero_redundancy_optimizer(ctx):
    """``ZeroRedundancyOptimizer(AdamW)``: gradients all-reduced and clipped outside it."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opts = ctx.case.options
    steps, accum = opts["steps"], opts["grad_accum"]
    group, rank, g_size = ctx.group, ctx.group_rank, ctx.group_size
    p0, max_norm = ctx.inputs["p0"], ctx.inputs["max_norm"]
    a, x = ctx.inputs["a"][:, :, rank], ctx.inputs["x"][:, :, rank]
    sizes = param_sizes(ctx.case)
    params = [torch.nn.Parameter(t.clone()) for t in p0.split(sizes)]
    zero = ZeroRedundancyOptimizer(
        params,
        optimizer_class=torch.optim.AdamW,
        process_group=group,
        lr=LR,
        betas=(BETA1, BETA2),
        eps=EPS,
        weight_decay=WEIGHT_DECAY,
        foreach=False,
        parameters_as_bucket_view=opts["bucket_view"],
    )
    rows = [[] for _ in params]
    mine = {f"{k}_{i}": [] for k in ("exp_avg", "exp_avg_sq", "step") for i in range(len(sizes))}
    for t in range(steps):
        for q in params:
            q.grad = None
        for mb in range(accum):
            p = torch.cat(params)
            loss = (0.5 * a[t, mb] * (p - x[t, mb]) ** 2).sum() / (accum * g_size)
            loss.backward()
        grads = all_reduce_by_all_to_all(torch.cat([q.grad for q in params]), group, g_size)
        for q, grad in zip(params, grads.split(sizes)):
            q.grad = grad
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
        zero.step()
        for i, q in enumerate(params):
            rows[i].append(q.detach().clone())
            state = zero.optim.state.get(q)
            if state:
                mine[f"exp_avg_{i}"].append(state["exp_avg"].clone())
                mine[f"exp_avg_sq_{i}"].append(state["exp_avg_sq"].clone())
                mine[f"step_{i}"].append(state["step"].reshape(1).float())
    out = {f"param_{i}": torch.stack(r) for i, r in enumerate(rows)}
    for k, v in mine.items():
        if not v:  # not the owner
            out[k] = torch.empty(0, dtype=torch.float32 if k.startswith("step_") else p0.dtype)
        else:
            out[k] = torch.cat(v) if k.startswith("step_") else torch.stack(v)
    return out


# -- triggers --------------------------------------------------------------------------------------
def padding_spans_ranks(case) -> bool:
    """More padding than one rank's chunk: the padding sits on several ranks."""
    n, g = case.sizes["numel"], case.group_size
    chunk = -(-n // g)
    return chunk * g - n > chunk


def clip_active(case) -> bool:
    """The first step's true gradient norm exceeds ``max_norm``: the clip really acts."""
    if case.options["clip_factor"] is None:
        return False
    inp = inputs(case)
    g1 = _mean_grad(inp["p0"].double(), inp["a"][0].double(), inp["x"][0].double(), case.group_size)
    return float(g1.norm()) > inp["max_norm"] > 0


STEP_TRIGGERS = {
    "clip active": clip_active,
    "steps>=2": lambda c: c.options["steps"] >= 2,
    "grad_accum>=2": lambda c: c.options["grad_accum"] >= 2,
    "steps>=2 with accumulation": lambda c: c.options["steps"] >= 2 and c.options["grad_accum"] >= 2,
}

TRIGGERS = {
    **STEP_TRIGGERS,
    "padding on several ranks": padding_spans_ranks,
    "odd numel on 2 ranks": lambda c: c.group_size == 2 and c.sizes["numel"] % 2 == 1,
    "stage 3 over several steps": lambda c: c.options["stage"] == 3 and c.options["steps"] >= 2,
    "stage >= 2 with accumulation on 2+ ranks": lambda c: (
        c.options["stage"] >= 2 and c.options["grad_accum"] > 1 and c.group_size > 1
    ),
    "several parameters across ranks": lambda c: len(param_sizes(c)) == 3 and c.group_size >= 3,
}

TORCH_TRIGGERS = {
    **STEP_TRIGGERS,
    "a parameter with no elements": lambda c: c.options["empty_param"],
    "bucket view on several ranks over steps": lambda c: (
        c.options["bucket_view"] and c.group_size >= 2 and c.options["steps"] >= 2
    ),
}


# -- planted bugs ------------------------------------------------------------------------------------
def reference_comm(case) -> CommBudget:
    """Per rank and step, all on all-to-alls (every rank sends its piece to every other): stage 3
    gathers the parameters (chunk), stage 1 all-reduces the accumulated gradient (numel), stages 2
    and 3 reduce-scatter each micro-batch (chunk each); the norm's sum of squares (one float32, or
    float64) when clipping; and stages 1-2 gather the parameters between steps."""
    o, g, n = case.options, case.group_size, case.sizes["numel"]
    chunk, item = -(-n // g), ITEMSIZE[case.dtype]
    acc = ITEMSIZE["float64" if case.dtype == "float64" else "float32"]
    per_step = [(chunk * item, 1)] if o["stage"] == 3 else []
    per_step += [(n * item, 1)] if o["stage"] == 1 else [(o["grad_accum"] * chunk * item, o["grad_accum"])]
    per_step += [(acc, 1)] if o["clip_factor"] is not None else []
    sent = sum(b for b, _ in per_step) * o["steps"] + (o["steps"] - 1) * chunk * item * (o["stage"] != 3)
    count = sum(c for _, c in per_step) * o["steps"] + (o["steps"] - 1) * (o["stage"] != 3)
    return CommBudget(sent=(g - 1) * sent, collectives=count, why="(g - 1) x the pieces above")


PLANTED = [
    PlantedBug(
        "reduce_scatter_as_all_reduce",
        "stages 2 and 3 reduce the whole gradient (an all-reduce) and keep their slice, where a "
        "reduce-scatter sends each rank only its own: right values, g times the gradient bytes",
        Expect(
            kind="communication",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["stage"] >= 2,
            note="stage 2 or 3",
        ),
        p95=2,
    ),
    PlantedBug(
        "local_grad_norm",
        "clipping norm of the local shard only, never all-reduced (needs 2+ ranks and an active clip)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["clip_factor"] == 0.5,
            outputs=("exp_avg", "exp_avg_sq"),
            note="active clip",
        ),
        p95=2,
        link="karpathy/llm.c#524",
    ),
    PlantedBug(
        "init_step",
        "an initialisation step advances the Adam step counter, so the first real update uses step-2 "
        "bias correction (also deepspeedai/DeepSpeed#5104, NVIDIA/Megatron-LM#5974)",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: c.options["steps"] == 1,
            outputs=("param", "step"),
            note="1 step",
        ),
        p95=1,
        link="deepspeedai/DeepSpeed#1823",
    ),
    PlantedBug(
        "padding_on_last_rank",
        "real-element count assumes all padding on the last rank; with padding on several ranks (1 "
        "element on 3 ranks: [1, 0, 0]) taking the shard raises, as in deepspeedai/DeepSpeed#6918",
        Expect(
            kind="rank-error",
            world_size=3,
            mesh=(3,),
            uneven=None,
            check=lambda c: padding_spans_ranks(c) and c.sizes["numel"] == 1,
            note="1 element ([1, 0, 0])",
        ),
        p95=3,
        link="deepspeedai/DeepSpeed#6974",
    ),
    PlantedBug(
        "padding_in_norm",
        "padding summed into the clipping norm (needs padding, an odd buffer on 2 ranks, and an active clip)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["clip_factor"] == 0.5 and c.sizes["numel"] % 2 == 1,
            note="odd size, active clip",
        ),
        p95=1,
    ),
    PlantedBug(
        "unscale_unscaled",
        "bf16 gradients divided by a loss scale (65536) never applied to the loss (bf16 only)",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: c.dtype == "bfloat16",
            outputs=("exp_avg", "exp_avg_sq"),
            note="bfloat16",
        ),
        p95=3,
        link="deepspeedai/DeepSpeed#7839",
    ),
    PlantedBug(
        "grads_not_zeroed",
        "gradient buffer not zeroed between optimizer steps, so step 2 adds step 1's gradients (needs 2 steps)",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: c.options["steps"] == 2,
            note="2 steps",
        ),
        p95=2,
        link="deepspeedai/DeepSpeed#7839",
    ),
    PlantedBug(
        "stage2_accum_unreduced",
        "stage >= 2 with gradient accumulation: the reduce-scatter is dispatched on the first "
        "micro-batch only, later micro-batches add the rank's own slice of its local gradient, "
        "unreduced (needs stage >= 2, accumulation and 2+ ranks at once)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["stage"] >= 2 and c.options["grad_accum"] == 2,
            note="stage >= 2, 2 micro-batches",
            needs=("grad_accum>=2", "stage=2"),
        ),
        p95=1,
        link="InfiniTensor/InfiniTrain#213",
    ),
    PlantedBug(
        "bf16_step_tensor",
        "bf16 step counter: 1 - beta2 ** step computed in the parameter dtype, where 0.999 rounds to "
        "1.0, so the denominator is inf and every Adam update vanishes; fp32 and fp64 right",
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            check=lambda c: c.dtype == "bfloat16",
            outputs=("param",),
            note="bfloat16",
        ),
        p95=3,
    ),
]

FLAT = StepwisePaddedFlat()

TARGET = Target(
    name="zero_adamw",
    description="ZeRO-sharded AdamW, stages 1-3, flat padded buffers, accumulation, clipping, vs torch AdamW",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"param": FLAT, "exp_avg": FLAT, "exp_avg_sq": FLAT, "step": Replicate()},
    implementations={"reference": "reference"},
    planted=PLANTED,
    triggers=TRIGGERS,
    comm={"reference": reference_comm},
)

#: PyTorch's FSDP2 (targets/zero_fsdp2.py)
FSDP2 = "shardfuzz.targets.zero_fsdp2:fsdp2"

TORCH_EXPECTED = [
    ExpectedFailure(
        "fsdp2_empty_param",
        "shardfuzz finding: FSDP2 (fully_shard) crashes in its gradient reduce-scatter on a "
        "parameter with no elements ('_chunk_cat expects non-empty tensor' in "
        "foreach_reduce_scatter_copy_in); the other parameters may be any size",
        Expect(
            kind="rank-error",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: 0 in param_sizes(c),
            note="a parameter of size 0",
        ),
        p95=1,
        impl=bind(FSDP2, empty_params=True),
    ),
]

# a second target, not a second implementation of zero_adamw: its state is per parameter (whole on
# the owner for ZeroRedundancyOptimizer, Owned(); Shard(0) DTensors for FSDP2, read from them),
# which the flat layouts above cannot describe (see the module docstring)
# FSDP2 (targets/zero_fsdp2.py): tests/test_verified.py runs each one; the reference
# (ZeroRedundancyOptimizer) is proved as every reference is (tests/test_targets.py)
TORCH_VERIFIED = [
    Verified(
        name="fsdp2",
        what="FSDP2 fully_shard with AdamW, gradient clipping and no-sync gradient accumulation; a "
        "parameter with no elements is refused (the expected failure fsdp2_empty_param)",
        examples=40,
        reaches=(
            "steps>=2",
            "steps>=2 with accumulation",
            "clip active",
            "uneven",
            "empty shard",
            "world>=3",
        ),
        refuses=("empty parameter",),
    ),
    Verified(
        name="fsdp2_hsdp",
        what="FSDP2 as HSDP on a 2 x 2 mesh (shard over 2 ranks, replicate over 2)",
        examples=40,
        world_sizes=(4,),
        reaches=("steps>=2 with accumulation", "clip active"),
        refuses=("HSDP needs a group of 4",),
        # the shard axis has 2 ranks: what makes a shard uneven or empty there
        also_reaches={
            "an odd parameter (uneven on the shard axis)": lambda c: any(s % 2 for s in param_sizes(c)),
            "a parameter of one element (an empty shard)": lambda c: 1 in param_sizes(c),
        },
    ),
]

TORCH_TARGET = Target(
    name="zero_adamw_torch",
    description="torch's ZeRO: ZeroRedundancyOptimizer(AdamW), state by owner; FSDP2 fully_shard, per-parameter "
    "Shard(0) DTensors",
    cases=torch_cases,
    inputs=inputs,
    oracle=oracle,
    outputs={
        **{f"param_{i}": Replicate() for i in range(N_PARAMS)},
        **{f"{k}_{i}": Owned() for i in range(N_PARAMS) for k in ("exp_avg", "exp_avg_sq", "step")},
    },
    implementations={
        "zero_redundancy_optimizer": "zero_redundancy_optimizer",
        "fsdp2": bind(FSDP2),
        "fsdp2_hsdp": bind(FSDP2, hsdp=True),
    },
    reference="zero_redundancy_optimizer",
    expected_failures=TORCH_EXPECTED,
    verified=TORCH_VERIFIED,
    triggers=TORCH_TRIGGERS,
)
