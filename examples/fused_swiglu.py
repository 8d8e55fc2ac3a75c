"""A SwiGLU MLP under tensor parallelism whose gate and up projections are one fused weight,
``w_gu = [gate; up]`` of shape [2 * hidden, d_model], as Megatron and vLLM store it: each rank holds
its shard of BOTH halves, which ``Shard(0, blocks=2)`` says (declared as an input layout, so
``ctx.local["w_gu"]`` is that shard, and as the gradient's layout). ``naive_chunk`` takes the
contiguous rows of the fused weight instead, the classic bug: rank 0 holds gate rows only.

    shardfuzz fuzz examples/fused_swiglu.py                      # the reference: nothing found
    shardfuzz fuzz examples/fused_swiglu.py --impl naive_chunk   # found at once

``blocks`` splits each block's rows by DTensor's rule; for a fused [q; k; v] weight give the heads a
dim of their own ([3 * heads, head_dim, d_model]) so that a shard holds whole heads.
"""

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


fused_swiglu = shardfuzz.Target(
    name="fused_swiglu",
    cases=sst.cases(
        "fused_swiglu",
        sizes={
            "tokens": sst.Free(1, 3),
            "d_model": sst.Free(1, 3),
            # even: on an uneven hidden the naive chunk's halves differ and its matmul raises
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
