"""A row-mean target whose oracle itself is broken: it raises on 2 rows or more. The target's error
must be reported as the target's, with its traceback, not as shardfuzz's nor as a finding."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    if inp["x"].shape[0] >= 2:
        raise ValueError("oracle bug: rows >= 2")
    return {"mean": inp["x"].mean(0)}


def sharded_mean(ctx):
    x = ctx.local["x"]
    total = torch.cat([x.sum(0), x.new_tensor([x.shape[0]])])
    dist.all_reduce(total, group=ctx.group)
    return {"mean": total[:-1] / total[-1]}


TARGET = shardfuzz.Target(
    name="row_mean",
    cases=lambda world_sizes=None: sst.cases(
        "row_mean",
        sizes={"rows": sst.Split(), "cols": sst.Free(1, 3)},
        world_sizes=world_sizes,
        dtypes=("float32",),
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"mean": shardfuzz.Replicate()},
    implementations={"reference": sharded_mean},
)
