"""Two planted bugs for the fleet tests (tests/test_fleet.py), on the toy target
(tests/data/toy_target.py): every case fails, one way or the other by the parity of ``n``, so a
few examples find both and shrinking one passes through the other."""

import torch
import torch.distributed as dist

from shardfuzz import Shard


def parity_bugs(ctx):
    """Odd ``n``: rank 1 raises (a rank error); even ``n``: rank 1's ``x2`` is off by one (a mismatch)."""
    if ctx.case.sizes["n"] % 2 and ctx.group_rank == 1:
        raise ValueError("rank 1 cannot take an odd n")
    local = ctx.local["x"]
    total = local.sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    parts = torch.zeros_like(ctx.inputs["x"])
    start = Shard(0).global_index((0,), ctx.group_rank, ctx.group_size, tuple(parts.shape))[0]
    parts[start : start + local.numel()] = local
    count = torch.tensor([local.numel()])
    dist.all_reduce(count, group=ctx.group)
    wrong = 1 if ctx.group_rank == 1 and ctx.case.sizes["n"] % 2 == 0 else 0
    return {"total": total, "x2": 2 * local + wrong, "parts": parts, "count": count}
