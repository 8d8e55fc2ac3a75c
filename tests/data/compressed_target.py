"""A sum over ranks whose all-reduce travels in bfloat16 whatever the case dtype (as DDP's
bf16_compress_hook sends float32 gradients): lossy by design, judged with
``Tolerance(precision="bfloat16")`` (``--precision bfloat16``); ``mean`` divides by the group
too, a bug at any precision."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, bind
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].sum(0)}


def compressed_sum(ctx, *, mean=False):
    wire = ctx.local["x"].sum(0).to(torch.bfloat16)  # the compression: a bfloat16 message
    dist.all_reduce(wire, group=ctx.group)
    total = wire.to(ctx.dtype)
    return {"total": total / ctx.group_size if mean else total}


TARGET = shardfuzz.Target(
    name="compressed",
    cases=sst.cases(
        "compressed",
        sizes={"rows": sst.Split(min_per_rank=1, max_per_rank=3), "cols": sst.Free(2, 4)},
        dtypes=("float32",),
        min_world=2,
        max_world=3,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": Shard(0)},
    outputs={"total": Replicate()},
    implementations={"reference": compressed_sum, "mean": bind(compressed_sum, mean=True)},
)
