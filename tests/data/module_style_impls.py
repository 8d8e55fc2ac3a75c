"""Implementations of the toy target (tests/data/toy_target.py) written with ``import shardfuzz``
and ``shardfuzz.NAME``, as the target spec writes ``raise shardfuzz.Unsupported(...)``, for
tests/test_standalone.py: a standalone script carries each ``shardfuzz.NAME`` as a plain name."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.spec.layouts as layouts


def wrong_rank1_module_style(ctx):
    """The toy reference with rank 1's ``x2`` off by one; one rank is refused, as the spec writes it."""
    if ctx.group_size == 1:
        raise shardfuzz.Unsupported("one rank: nothing is split", reason="one rank")
    local = ctx.local["x"]
    total = local.sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    parts = torch.zeros_like(ctx.inputs["x"])
    start = shardfuzz.Shard(0).global_index((0,), ctx.group_rank, ctx.group_size, tuple(parts.shape))[0]
    parts[start : start + local.numel()] = local
    count = torch.tensor([local.numel()])
    dist.all_reduce(count, group=ctx.group)
    x2 = 2 * local + (1 if ctx.group_rank == 1 else 0)  # the bug
    return {"total": total, "x2": x2, "parts": parts, "count": count}


def passes_the_module_on(ctx):
    """Hands the module itself to a helper: no standalone script can carry that."""
    return _helper(shardfuzz, ctx)


def uses_a_submodule(ctx):
    """Reads a module of shardfuzz through an alias (``layouts.split_sizes``: a function, carried)."""
    return {"sizes": torch.tensor(layouts.split_sizes(ctx.inputs["x"].shape[0], ctx.group_size))}


def _helper(module, ctx):
    raise module.Unsupported("never run")
