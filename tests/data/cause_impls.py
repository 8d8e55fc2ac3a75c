"""Implementations of the toy target (tests/data/toy_target.py) with planted bugs for signatures by
cause (tests/test_signature.py): two different backward bugs that both raise from torch's one
autograd engine frame, and one bug whose message varies with the case's sizes. Each raises on
every case, before any collective."""

import torch

from shardfuzz import Unsupported


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return grad[:-1]  # planted: one element short


class _Shift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + 1

    @staticmethod
    def backward(ctx, grad):
        return torch.cat([grad, grad[:1]])  # planted: one element too many


def _backward_through(fn, local):
    """The one place both backward bugs call autograd from: both raise in its engine frame."""
    x = local.detach().requires_grad_(True)
    fn.apply(x).sum().backward()


def backward_scale(ctx):
    _backward_through(_Scale, ctx.local["x"])
    raise AssertionError("unreachable: the planted bug raised above")


def backward_shift(ctx):
    _backward_through(_Shift, ctx.local["x"])
    raise AssertionError("unreachable: the planted bug raised above")


def flatten_too_far(ctx):
    """One bug: a view one element too long, through ``view`` or ``reshape`` (by the size)."""
    local = ctx.local["x"]
    op = "view" if ctx.case.sizes["n"] % 2 else "reshape"
    getattr(local, op)(local.numel() + 1, 1)
    raise AssertionError("unreachable: the planted bug raised above")


def slow_wrong(ctx):
    """Every rank's ``x2`` is off on every case, after a short sleep: a shrink that takes a while
    (a mismatch: the pool is kept, where a rank error would restart it at every step)."""
    import time

    time.sleep(0.1)
    return _toy_outputs(ctx, 1)


def _toy_outputs(ctx, x2_offset):
    """The toy reference's outputs (tests/data/toy_target.py), with ``x2_offset`` added to ``x2``."""
    import torch.distributed as dist

    from shardfuzz import Shard

    local = ctx.local["x"]
    total = local.sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    parts = torch.zeros_like(ctx.inputs["x"])
    start = Shard(0).global_index((0,), ctx.group_rank, ctx.group_size, tuple(parts.shape))[0]
    parts[start : start + local.numel()] = local
    count = torch.tensor([local.numel()])
    dist.all_reduce(count, group=ctx.group)
    return {"total": total, "x2": 2 * local + x2_offset, "parts": parts, "count": count}


def wrong_from_three_rows(ctx):
    """Every rank's ``x2`` is off when the global size is 3 or more: a bug of the local math that
    needs no communication (it fails on 1 rank with 3 rows)."""
    return _toy_outputs(ctx, 1 if ctx.case.sizes["n"] >= 3 else 0)


def wrong_on_rank1(ctx):
    """Rank 1's ``x2`` is off: a bug that needs 2 ranks."""
    return _toy_outputs(ctx, 1 if ctx.group_rank == 1 else 0)


def wrong_on_rank1_never_alone(ctx):
    """Rank 1's ``x2`` is off, and a 1-rank case is refused as unsupported: a 1-rank try replays to
    no case Hypothesis may run (Unsatisfiable)."""
    if ctx.world_size == 1:
        raise Unsupported("needs 2 ranks")
    return wrong_on_rank1(ctx)


def refuses_odd_worlds(ctx):
    """The toy reference on an even world; an odd one refused with a reason to count and a message
    that says more (``shardfuzz case`` prints both)."""
    if ctx.world_size % 2:
        raise Unsupported(f"{ctx.world_size} ranks: this one splits in halves only", reason="odd world")
    return _toy_outputs(ctx, 0)


def not_implemented(ctx):
    """What torch says for what it does not support (ColwiseParallel on a Conv2d), on every case."""
    raise NotImplementedError("ColwiseParallel currently only support nn.Linear and nn.Embedding!")
