"""A complete user target: the mean over rows sharded across ranks, and a planted bug."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):  # full tensors, built on CPU from the case seed
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):  # the single-process answer
    return {"mean": inp["x"].mean(0)}


def sharded_mean(ctx):  # every rank: its rows in ctx.local, every input whole in ctx.inputs
    x = ctx.local["x"]
    total = torch.cat([x.sum(0), x.new_tensor([x.shape[0]])])
    dist.all_reduce(total, group=ctx.group)
    return {"mean": total[:-1] / total[-1]}


def mean_of_means(ctx):  # planted bug: right only when every rank holds as many rows
    m = ctx.local["x"].mean(0).nan_to_num()
    dist.all_reduce(m, group=ctx.group)
    return {"mean": m / ctx.group_size}


TARGET = shardfuzz.Target(
    name="row_mean",
    cases=lambda world_sizes=None: sst.cases(
        "row_mean", sizes={"rows": sst.Split(), "cols": sst.Free(1, 3)}, world_sizes=world_sizes
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"mean": shardfuzz.Replicate()},
    implementations={"reference": sharded_mean, "mean_of_means": mean_of_means},
)
