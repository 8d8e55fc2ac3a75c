"""A mixed-precision output: the oracle keeps ``m`` in ``promote_types(dtype, float32)`` (master
weights, optimizer state), so a 16-bit case judges a float32 output at its own dtype's bound."""

import torch

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    x = inp["x"]
    return {"m": 2 * x.to(torch.promote_types(x.dtype, torch.float32))}


def reference(ctx):
    x = ctx.local["x"]
    return {"m": 2 * x.to(torch.promote_types(x.dtype, torch.float32))}


TARGET = Target(
    name="master",
    cases=lambda world_sizes=None: sst.cases("master", sizes={"n": sst.Split()}, world_sizes=world_sizes),
    inputs=inputs,
    oracle=oracle,
    outputs={"m": Shard(0)},
    input_layouts={"x": Shard(0)},
    implementations={"reference": reference},
)
