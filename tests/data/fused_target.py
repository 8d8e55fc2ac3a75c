"""A SwiGLU MLP under tensor parallelism whose gate and up projections are one fused weight
``w_gu = [gate; up]`` ([2 * hidden, d_model]): each rank holds its shard of both halves,
``Shard(0, blocks=2)``, as Megatron's fused projections are held (tests/test_layouts.py)."""

import torch.nn.functional as F

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, bind
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.parallel import CopyToGroup, ReduceFromGroup

FUSED = Shard(0, blocks=2)


def inputs(case):
    b, d, h = (case.sizes[k] for k in ("tokens", "d_model", "hidden"))
    g = generator(case)
    return {
        "x": randn(case, b, d, gen=g),
        "w_gu": randn(case, 2 * h, d, gen=g, role="weight", scale=d**-0.5),
        "w_d": randn(case, d, h, gen=g, role="weight", scale=h**-0.5),
        "dy": randn(case, b, d, gen=g, profile=False),
    }


def oracle(inp, case):
    w_gu = inp["w_gu"].clone().requires_grad_()
    gate, up = F.linear(inp["x"], w_gu).chunk(2, dim=-1)
    y = F.linear(F.silu(gate) * up, inp["w_d"])
    y.backward(inp["dy"])
    return {"y": y.detach(), "grad_w_gu": w_gu.grad}


def swiglu(ctx, *, naive=False):
    # the naive chunk: contiguous rows of the fused weight, so rank 0 holds gate rows only
    w_gu = ctx.shard(ctx.inputs["w_gu"], Shard(0)) if naive else ctx.local["w_gu"]
    w_gu = w_gu.clone().requires_grad_()
    gate, up = F.linear(CopyToGroup.apply(ctx.inputs["x"], ctx.group), w_gu).chunk(2, dim=-1)
    w_d = ctx.shard(ctx.inputs["w_d"], Shard(1))
    y = ReduceFromGroup.apply(F.linear(F.silu(gate) * up, w_d), ctx.group)
    y.backward(ctx.inputs["dy"])
    return {"y": y.detach(), "grad_w_gu": w_gu.grad}


fused = shardfuzz.Target(
    name="fused",
    cases=sst.cases(
        "fused",
        sizes={
            "tokens": sst.Free(1, 3),
            "d_model": sst.Free(1, 3),
            "hidden": sst.Split(min_per_rank=1, max_per_rank=2, uneven=False),
        },
        max_world=3,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"w_gu": FUSED},
    outputs={"y": Replicate(), "grad_w_gu": FUSED},
    gradients=("grad_w_gu",),
    implementations={"reference": swiglu, "naive_chunk": bind(swiglu, naive=True)},
)
