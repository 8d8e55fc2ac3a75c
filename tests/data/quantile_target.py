"""A quantile over a sharded dim, by torch.quantile in the oracle: its position ``q * (n - 1)`` is
a float64 result that becomes an index (``ceil``, a cast to ``long``, a ``gather``)."""

import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target
from shardfuzz.spec.inputs import generator, randn

Q = (0.0, 0.5, 1.0)


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    x = inp["x"]
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()  # torch.quantile's dtypes
    return {"q": torch.quantile(wide, torch.tensor(Q, dtype=wide.dtype)).to(x.dtype)}


def reference(ctx):
    """Every shard gathered (padded to the longest), then torch.quantile on the whole."""
    local, n = ctx.local["x"], ctx.case.sizes["n"]
    longest = -(-n // ctx.group_size)
    padded = torch.zeros(longest, dtype=local.dtype)
    padded[: local.numel()] = local
    parts = [torch.empty_like(padded) for _ in range(ctx.group_size)]
    dist.all_gather(parts, padded, group=ctx.group)
    sizes = [min(longest, max(0, n - r * longest)) for r in range(ctx.group_size)]
    x = torch.cat([p[:s] for p, s in zip(parts, sizes)])
    return {"q": torch.quantile(x.double(), torch.tensor(Q, dtype=torch.float64)).to(local.dtype)}


def a_little_high(ctx):
    """1% over: a mismatch whose verdict draws the noise samples (which crashed at q = 1)."""
    return {"q": reference(ctx)["q"] * 1.01}


TARGET = Target(
    name="quantile",
    cases=lambda world_sizes=None: sst.cases("quantile", sizes={"n": sst.Split()}, world_sizes=world_sizes),
    inputs=inputs,
    oracle=oracle,
    outputs={"q": Replicate()},
    input_layouts={"x": Shard(0)},
    implementations={"reference": reference, "a_little_high": a_little_high},
)
