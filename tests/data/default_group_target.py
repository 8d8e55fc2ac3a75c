"""A row mean written for a world of its own: collectives on the default group, the world size
from ``dist.get_world_size()`` (as much code outside shardfuzz is written). On 1-D meshes that
is right on local ranks; on rank servers a case smaller than the torchrun world must see the
same (tests/test_rank_servers.py)."""

import torch
import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], case.sizes["cols"], gen=generator(case))}


def oracle(inp, case):
    return {"mean": inp["x"].mean(0)}


def default_world(ctx):
    x = ctx.local["x"]
    total = torch.cat([x.sum(0), x.new_tensor([x.shape[0]])])
    dist.all_reduce(total)  # the default group: the whole world of this case
    return {"mean": total[:-1] / total[-1]}


def mean_of_means(ctx):  # planted bug: right only when every rank holds as many rows
    m = ctx.local["x"].mean(0).nan_to_num()
    dist.all_reduce(m)
    return {"mean": m / dist.get_world_size()}


TARGET = shardfuzz.Target(
    name="default_group_mean",
    cases=lambda world_sizes=None: sst.cases(
        "default_group_mean",
        sizes={"rows": sst.Split(), "cols": sst.Free(1, 3)},
        world_sizes=world_sizes,
        max_dims=1,  # the default group is the group under test
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0)},
    outputs={"mean": shardfuzz.Replicate()},
    implementations={"reference": default_world, "mean_of_means": mean_of_means},
)
