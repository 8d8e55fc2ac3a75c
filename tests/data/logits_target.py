"""A target whose every input has a role the ``large`` and ``small`` profiles leave alone (a new
user's attention block: its input a ``logits`` tensor, its weights ``weight``), for
tests/test_display.py: the summary says those profiles changed no input."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    g = generator(case)
    rows, cols = case.sizes["rows"], case.sizes["cols"]
    return {"x": randn(case, rows, cols, gen=g, role="logits"), "w": randn(case, cols, gen=g, role="weight")}


def oracle(inp, case):
    return {"y": (torch.softmax(inp["x"], dim=-1) * inp["w"]).sum()}


def reference(ctx):
    y = (torch.softmax(ctx.local["x"], dim=-1) * ctx.inputs["w"]).sum()
    dist.all_reduce(y, group=ctx.group)
    return {"y": y}


TARGET = shardfuzz.Target(
    name="logits_only",
    cases=lambda world_sizes=None: sst.cases(
        "logits_only", sizes={"rows": sst.Split(), "cols": sst.Free(1, 4)}, world_sizes=world_sizes
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0), "w": shardfuzz.Replicate()},
    outputs={"y": shardfuzz.Replicate()},
    implementations={"reference": reference},
)
