"""A target whose strategy draws one choice its cases never read (tests/test_engine.py): Hypothesis'
shrinker minimises that choice too, and every such try is a case already run."""

import hypothesis.strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    return {"x2": 2 * inp["x"]}


def reference(ctx):
    return {"x2": 2 * ctx.local["x"]}


def wrong_rank1(ctx):
    out = reference(ctx)
    if ctx.group_rank == 1:
        out["x2"] = out["x2"] + 1
    return out


def cases(world_sizes=None):
    drawn = sst.cases(
        "unread",
        sizes={"n": sst.Split(max_per_rank=3)},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("normal",),
    )
    return st.tuples(drawn, st.integers(0, 1000)).map(lambda pair: pair[0])


UNREAD = Target(
    name="unread",
    description="a doubling, drawn with a choice the case never reads",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"x2": Shard(0)},
    input_layouts={"x": Shard(0)},
    implementations={"reference": "reference", "wrong_rank1": "wrong_rank1"},
)
