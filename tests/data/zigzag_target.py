"""A context-parallel target laid out only by ``Zigzag`` (no ``Shard``), for tests/test_covering.py:
its progress line has no DTensor split-rule conditions, which mean nothing there."""

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["seq"], 2, gen=generator(case))}


def oracle(inp, case):
    return {"y": 2 * inp["x"]}


def reference(ctx):
    return {"y": 2 * ctx.local["x"]}


TARGET = shardfuzz.Target(
    name="zigzag_only",
    cases=lambda world_sizes=None: sst.cases(
        "zigzag_only", sizes={"seq": sst.Split()}, world_sizes=world_sizes
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Zigzag(0)},
    outputs={"y": shardfuzz.Zigzag(0)},
    implementations={"reference": reference},
)
