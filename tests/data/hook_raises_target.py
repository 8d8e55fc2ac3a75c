"""A target whose ``per_group`` quantity raises on an option value its strategy never draws (a new
user's lookup table of per-parameter sizes), for tests/test_bad_inputs.py: ``--option k=4``."""

import torch.distributed as dist
from hypothesis import strategies as st

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn

WIDTHS = {1: 2, 2: 3, 3: 4}


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], WIDTHS[case.options["k"]], gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].sum(0)}


def reference(ctx):
    total = ctx.local["x"].sum(0)
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


TARGET = shardfuzz.Target(
    name="hook_raises",
    cases=lambda world_sizes=None: sst.cases(
        "hook_raises", sizes={"rows": sst.Split()}, options={"k": st.integers(1, 3)}, world_sizes=world_sizes
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"total": shardfuzz.Replicate()},
    per_group={"width": lambda case: WIDTHS[case.options["k"]]},
    implementations={"reference": reference},
)
