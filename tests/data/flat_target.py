"""A ZeRO-style flat buffer, for tests/test_standalone.py (a reproducer of PaddedFlat outputs): each
rank owns ceil(n / world) elements of a flat parameter, the last rank's padded; an SGD step on the
owned shard, with the gradient divided by its global norm."""

import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import PaddedFlat, Replicate, Target
from shardfuzz.spec.inputs import generator, randn


def cases(world_sizes=None):
    return sst.cases(
        "flat", sizes={"n": sst.Split(max_per_rank=3)}, world_sizes=world_sizes, dtypes=("float32",)
    )


def inputs(case):
    g = generator(case)
    return {"p": randn(case, case.sizes["n"], gen=g), "g": randn(case, case.sizes["n"], gen=g)}


def oracle(inp, case):
    norm = inp["g"].norm().reshape(1)
    return {"p": inp["p"] - 0.1 * inp["g"] / (norm + 1e-6), "norm": norm}


def _step(ctx, pad_value):
    n, world, rank = ctx.inputs["p"].shape[0], ctx.group_size, ctx.group_rank
    chunk = -(-n // world)
    flat_p = torch.cat([ctx.inputs["p"], torch.full((chunk * world - n,), pad_value)])
    flat_g = torch.cat([ctx.inputs["g"], torch.full((chunk * world - n,), pad_value)])
    p, g = flat_p[rank * chunk : (rank + 1) * chunk], flat_g[rank * chunk : (rank + 1) * chunk]
    sq = g.pow(2).sum().reshape(1)  # the padding is summed in: zeros in the reference
    dist.all_reduce(sq, group=ctx.group)
    norm = sq.sqrt()
    return {"p": p - 0.1 * g / (norm + 1e-6), "norm": norm}


def reference(ctx):
    return _step(ctx, 0.0)


def padding_in_norm(ctx):
    """The padding is not zeroed (ones): it is summed into the norm (needs padding)."""
    return _step(ctx, 1.0)


TARGET = Target(
    name="flat",
    description="a flat parameter buffer padded to the world size, one normalised SGD step",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"p": PaddedFlat(), "norm": Replicate()},
    implementations={"reference": "reference", "padding_in_norm": "padding_in_norm"},
)
