"""y = x * (1 - p), elementwise on a sharded x: at p = 1 every output is 0, whatever the code does
(a dropout at p = 1). A clean run that draws mostly such cases compared nothing; it says so."""

from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    return {"y": inp["x"] * (1 - case.options["p"])}


def reference(ctx):
    return {"y": ctx.local["x"] * (1 - ctx.case.options["p"])}


TARGET = Target(
    name="scaled",
    cases=lambda world_sizes=None: sst.cases(
        "scaled",
        sizes={"n": sst.Split()},
        options={"p": st.sampled_from([0.5, 1.0])},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"y": Shard(0)},
    input_layouts={"x": Shard(0)},
    implementations={"reference": reference},
)
