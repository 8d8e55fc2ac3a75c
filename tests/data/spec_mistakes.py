"""Targets whose specs name things that do not exist (each must be a usage error), and one whose
unused output is None in the oracle and in every rank (allowed: compared as "no value")."""

import dataclasses

import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def cases(world_sizes=None):
    return sst.cases(
        "misspelt_layout",
        sizes={"rows": sst.Split(), "cols": sst.Free(1, 2)},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("normal",),
    )


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].sum(0), "unused": None}


def total(ctx):
    t = ctx.local["x"].sum(0)
    dist.all_reduce(t, group=ctx.group)
    return {"total": t, "unused": None}


def full_total(ctx):  # right only when x is replicated: what a misspelt layout key lets pass
    return {"total": ctx.local["x"].sum(0), "unused": None}


def magnitude(inp, case):
    return {"totl": inp["x"].abs().sum(0)}


MISSPELT = shardfuzz.Target(
    name="misspelt_layout",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    input_layouts={"xx": shardfuzz.Shard(0)},  # the input is "x"
    outputs={"total": shardfuzz.Replicate(), "unused": shardfuzz.Replicate()},
    implementations={"reference": full_total},
)


def _renamed(name):
    return lambda world_sizes=None: cases(world_sizes).map(lambda c: dataclasses.replace(c, target=name))


NONE_OUTPUT = shardfuzz.Target(
    name="none_output",
    cases=_renamed("none_output"),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"total": shardfuzz.Replicate(), "unused": shardfuzz.Replicate()},
    implementations={"reference": total},
)

MISSPELT_MAGNITUDE = shardfuzz.Target(
    name="misspelt_magnitude",
    cases=_renamed("misspelt_magnitude"),
    inputs=inputs,
    oracle=oracle,
    magnitude=magnitude,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"total": shardfuzz.Replicate(), "unused": shardfuzz.Replicate()},
    implementations={"reference": total},
)

UNDECLARED = shardfuzz.Target(
    name="undeclared_output",
    cases=_renamed("undeclared_output"),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"total": shardfuzz.Replicate(), "totl": shardfuzz.Replicate()},
    implementations={"reference": total},
)


def _past_bounds(world_sizes=None):
    """A map that moves ``cols`` past the ``Free(1, 2)`` it wraps (2 becomes 3), declared within
    those bounds all the same (as a new user's GQA rounding of head counts did)."""
    base = sst.cases(
        "past_bounds",
        sizes={"rows": sst.Split(), "cols": sst.Free(1, 2)},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("normal",),
    )
    moved = base.map(
        lambda c: dataclasses.replace(c, sizes={**c.sizes, "cols": c.sizes["cols"] + c.sizes["cols"] // 2})
    )
    return sst.bounded_like(moved, base)


PAST_BOUNDS = shardfuzz.Target(
    name="past_bounds",
    cases=_past_bounds,
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"total": shardfuzz.Replicate(), "unused": shardfuzz.Replicate()},
    implementations={"reference": total},
)
