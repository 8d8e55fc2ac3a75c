"""A target whose outputs are all empty when its option ``n_params`` is pinned to 0 (a new user's
ZeRO target run with ``--option n_params=0``), for tests/test_cli.py: the summary says no element
was compared, where it said "closest pass 0 (every compared element equal)"."""

import torch.distributed as dist
from hypothesis import strategies as st

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.options["n_params"], gen=generator(case))}


def oracle(inp, case):
    return {"y": 2 * inp["x"], "total": inp["x"].sum(0)}


def reference(ctx):
    total = ctx.local["x"].sum(0)
    dist.all_reduce(total, group=ctx.group)
    return {"y": 2 * ctx.local["x"], "total": total}


TARGET = shardfuzz.Target(
    name="empty_outputs",
    cases=lambda world_sizes=None: sst.cases(
        "empty_outputs",
        sizes={"rows": sst.Split()},
        options={"n_params": st.integers(1, 2)},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"y": shardfuzz.Shard(0), "total": shardfuzz.Replicate()},
    implementations={"reference": reference},
)
