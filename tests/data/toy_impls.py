"""Implementations of the toy target (tests/data/toy_target.py) in a file of their own, so failure
files hold a target file and an implementation file (the tests move both)."""

import time

import torch
import torch.distributed as dist

from shardfuzz import Shard


def _toy_reference(ctx, x2_offset):
    """The toy reference's outputs, ``x2`` off by ``x2_offset``."""
    local = ctx.local["x"]
    total = local.sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    parts = torch.zeros_like(ctx.inputs["x"])
    start = Shard(0).global_index((0,), ctx.group_rank, ctx.group_size, tuple(parts.shape))[0]
    parts[start : start + local.numel()] = local
    count = torch.tensor([local.numel()])
    dist.all_reduce(count, group=ctx.group)
    return {"total": total, "x2": 2 * local + x2_offset, "parts": parts, "count": count}


def off_by_one(ctx):
    """The toy reference, with rank 1's ``x2`` off by one."""
    return _toy_reference(ctx, 1 if ctx.group_rank == 1 else 0)


def raise_while_peer_sleeps(ctx):
    """Rank 1 raises at once; rank 0 sleeps 0.3 s first (not runnable: as on a page fault, a lazy
    import or the end of a new group's connections), then enters an all-reduce."""
    if ctx.group_rank == 1:
        raise ValueError("rank 1 raises before any collective")
    time.sleep(0.3)
    total = ctx.local["x"].sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


def raise_while_peer_computes(ctx):
    """Rank 1 raises at once; rank 0 computes for 0.1 s of CPU first, then enters an all-reduce
    (the peer of a crash that has not reached its next collective when the crash is reported)."""
    if ctx.group_rank == 1:
        raise ValueError("rank 1 raises before any collective")
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    total = ctx.local["x"].sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


def single_collectives(ctx):
    """The toy reference through torch's single-tensor collectives (``all_gather_single`` and
    ``reduce_scatter_single``, which FSDP2 calls since torch 2.13): each rank's sum gathered, and
    the count reduce-scattered from each rank's row of its own size."""
    local, g = ctx.local["x"], ctx.group_size
    sums = torch.zeros(g, dtype=local.dtype)
    dist.all_gather_single(sums, local.sum().reshape(1), group=ctx.group)
    count = torch.zeros(1, dtype=torch.int64)
    dist.reduce_scatter_single(count, torch.full((g,), local.numel(), dtype=torch.int64), group=ctx.group)
    parts = torch.zeros_like(ctx.inputs["x"])
    start = Shard(0).global_index((0,), ctx.group_rank, ctx.group_size, tuple(parts.shape))[0]
    parts[start : start + local.numel()] = local
    return {"total": sums.sum().reshape(1), "x2": 2 * local, "parts": parts, "count": count}


def rare_random_offset(ctx):
    """The toy reference, with ``x2`` off by one on the case seeds whose first draw from torch's
    global generator is under 0.05 (a dropout-like bug): only a run seeded as the ranks were
    fails, so a reproducer must seed torch as they did (1 in 20 of unseeded runs fail)."""
    return _toy_reference(ctx, 1.0 if torch.rand(1).item() < 0.05 else 0.0)


def with_extra(ctx):
    """Every declared output, and one more (not compared, as an oracle's extra is not)."""
    return {**_toy_reference(ctx, 0), "debug": 3 * ctx.local["x"]}


def without_x2(ctx):
    """A declared output left out: a layout finding."""
    out = _toy_reference(ctx, 0)
    del out["x2"]
    return out


def raise_after_distribute(ctx):
    """Rank 1 raises while rank 0 replicates x through DTensor's ``distribute_tensor``, which
    broadcasts with a function torch bound by name (``_collective_utils.broadcast``)."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    if ctx.group_rank == 1:
        raise ValueError("boom on rank 1 before distribute_tensor")
    distribute_tensor(ctx.inputs["x"], ctx.mesh.device_mesh(), [Replicate()])
    return _toy_reference(ctx, 0.0)


def fails_every_other_run(ctx):
    """The toy reference, with ``total`` wrong on rank 0 on every other run of a case (a race: an
    async all-reduce never waited on): runs counted in a file named after the case seed, so one
    test's replays count, and a pass is not the last word."""
    import os
    import tempfile

    ref = _toy_reference(ctx, 0.0)
    if ctx.group_rank != 0:
        return ref
    path = os.path.join(tempfile.gettempdir(), f"shardfuzz-every-other-{ctx.case.seed}")
    runs = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(runs + 1))
    return {**ref, "total": ref["total"] + 1} if runs % 2 == 0 else ref
