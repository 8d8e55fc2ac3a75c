"""A sharded log-sum-exp of a vector drawn with the edge profile only: float16's largest value
(``edge='max'``) overflows ``exp`` even in float64, so the oracle refuses those cases; the other
edge kinds are ordinary cases."""

import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target
from shardfuzz.spec.inputs import generator, randn


def cases(world_sizes=None):
    return sst.cases(
        "edge_exp_sum",
        sizes={"n": sst.Split(min_per_rank=2, max_per_rank=3)},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("edge",),
    )


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].exp().sum().reshape(1)}


def reference(ctx):
    total = ctx.local["x"].exp().sum().reshape(1)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


EDGE_EXP_SUM = Target(
    name="edge_exp_sum",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"total": Replicate()},
    input_layouts={"x": Shard(0)},
    implementations={"reference": "reference"},
)
