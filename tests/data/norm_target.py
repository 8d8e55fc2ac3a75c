"""The p-norm of a vector split over the ranks, p drawn from 2 and inf (a gradient-clipping norm):
a case of p = inf writes ``inf`` in its repr, its rerun line, its failure file and its scripts."""

import math

import torch
import torch.distributed as dist
from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    return {"norm": torch.linalg.vector_norm(inp["x"], case.options["p"]).reshape(1)}


def _norm(ctx, inf_op):
    x, p = ctx.local["x"], ctx.case.options["p"]
    if math.isinf(p):
        part = x.abs().amax().reshape(1) if x.numel() else torch.zeros(1, dtype=x.dtype)
        dist.all_reduce(part, op=inf_op, group=ctx.group)
        return {"norm": part}
    part = x.abs().pow(p).sum().reshape(1)
    dist.all_reduce(part, group=ctx.group)
    return {"norm": part.pow(1 / p)}


def reference(ctx):
    return _norm(ctx, dist.ReduceOp.MAX)


def inf_summed(ctx):
    """The inf-norm's pieces summed where their max was due."""
    return _norm(ctx, dist.ReduceOp.SUM)


TARGET = Target(
    name="norm",
    cases=lambda world_sizes=None: sst.cases(
        "norm",
        sizes={"n": sst.Split(min_per_rank=1)},
        options={"p": st.sampled_from([2.0, math.inf])},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"norm": Replicate()},
    input_layouts={"x": Shard(0)},
    implementations={"reference": reference, "inf_summed": inf_summed},
)
