"""A column sum over rows split across ranks, reduced in the case dtype (each rank's partial sum,
then an all-reduce), for tests/test_noise.py: with ``big``, the rows are 60000, 60000, -60000 and
-59000, whose total 1000 fits float16 while the first rank's partial sum (120000) does not. A
correct implementation then overflows in float16, and the case is counted as past the dtype's
range, never judged; an implementation wrong in another way is still found."""

import torch
import torch.distributed as dist
from hypothesis import strategies as st

import shardfuzz
import shardfuzz.strategies as sst

BIG = [60000.0, 60000.0, -60000.0, -59000.0]


def inputs(case):
    rows = BIG if case.options["big"] else [1.0, 2.0, 3.0, 4.0]
    return {"x": torch.tensor(rows, dtype=getattr(torch, case.dtype)).reshape(4, 1)}


def oracle(inp, case):
    return {"total": inp["x"].sum(0)}


def reference(ctx):
    total = ctx.local["x"].sum(0)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


def inf_on_rank_0(ctx):
    """Wrong on small values too: an infinity no order of the sum makes."""
    total = ctx.local["x"].sum(0)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total / 0 if ctx.rank == 0 else total}


TARGET = shardfuzz.Target(
    name="fp16_sum",
    cases=lambda world_sizes=None: sst.cases(
        "fp16_sum",
        sizes={"rows": sst.Split(min_per_rank=2, max_per_rank=2)},
        options={"big": st.booleans()},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"total": shardfuzz.Replicate()},
    implementations={"reference": reference, "inf_on_rank_0": inf_on_rank_0},
)
