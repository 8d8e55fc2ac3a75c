"""DTensor's topk on a replicated input, ``k`` drawn: torch 2.13 leaves ``k`` out of topk's
sharding-cache key, so a rank that ran ``k=2`` before gives ``k=1`` the output shape of ``k=2``
unless each example starts with empty caches (``shardfuzz.ranks.task.clear_dtensor_caches``)."""

import torch
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate, distribute_tensor

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    return {"top": torch.topk(inp["x"], case.options["k"], dim=0)[0]}


def replicated_topk(ctx):
    x = distribute_tensor(ctx.inputs["x"], ctx.mesh.device_mesh()["impl"], [Replicate()], src_data_rank=None)
    return {"top": torch.topk(x, ctx.case.options["k"], dim=0)[0]}


TARGET = shardfuzz.Target(
    name="dtensor_cache",
    cases=lambda world_sizes=None: sst.cases(
        "dtensor_cache",
        sizes={"n": sst.Free(2, 3)},
        world_sizes=world_sizes,
        profiles=("normal",),
        options={"k": st.sampled_from([1, 2])},
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"top": shardfuzz.FromDTensor()},
    implementations={"reference": replicated_topk},
)
