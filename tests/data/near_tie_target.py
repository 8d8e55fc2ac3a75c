"""A decision within rounding of a tie: the argmax of two scores ``a + b``, 1 and 2 - (1 - 2^-8),
that differ by 2^-8, half a bfloat16 rounding of 1. In float64 the second wins; in bfloat16 it
rounds to 1.0 (half way, to even) and ``argmax`` takes the first (the lower index). The
implementation decides from its own case-dtype scores, as a k-means that assigns clusters from its
own distances does: correct code whose decision flips by a rounding. Odd rows are decided clearly."""

import torch

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target


def inputs(case):
    n, dtype = case.sizes["n"], getattr(torch, case.dtype)
    a = torch.tensor([1.0, 2.0], dtype=torch.float64).repeat(n, 1)
    b = torch.tensor([0.0, -1.0 + 2.0**-8], dtype=torch.float64).repeat(n, 1)
    b[1::2, 1] = 1.0
    return {"a": a.to(dtype), "b": b.to(dtype)}


def oracle(inp, case):
    return {"choice": (inp["a"] + inp["b"]).argmax(-1)}


def reference(ctx):
    return {"choice": (ctx.local["a"] + ctx.local["b"]).argmax(-1)}


TARGET = Target(
    name="near_tie",
    cases=lambda world_sizes=None: sst.cases(
        "near_tie", sizes={"n": sst.Split()}, dtypes=("bfloat16",), world_sizes=world_sizes
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"choice": Shard(0)},
    input_layouts={"a": Shard(0), "b": Shard(0)},
    implementations={"reference": reference},
)
