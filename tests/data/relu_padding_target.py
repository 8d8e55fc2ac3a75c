"""x @ W -> relu -> @ W2, and dx, where token row 1 is padding (all zeros). The ``relu_prime_at_0``
implementation's hand-written backward uses ``h >= 0`` (relu'(0) = 1): wrong exactly on the padding
row, whose products are exact zeros in every dtype (a reviewer's case against the noise model's
underflow term, which must leave an exact 0 alone)."""

import torch

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Target, bind


def inputs(case):
    dt = getattr(torch, case.dtype)
    g = torch.Generator().manual_seed(case.seed)
    x = torch.randn(4, 8, generator=g).to(dt)
    x[1] = 0
    return {"x": x, "W": torch.randn(8, 16, generator=g).to(dt), "W2": torch.randn(16, 8, generator=g).to(dt)}


def oracle(inp, case):
    x = inp["x"].clone().requires_grad_()
    (torch.relu(x @ inp["W"]) @ inp["W2"]).sum().backward()
    return {"dx": x.grad}


def backward(ctx, *, relu_prime_at_0=0.0):
    x, w, w2 = ctx.inputs["x"], ctx.inputs["W"], ctx.inputs["W2"]
    h = x @ w
    mask = (h > 0) | ((h == 0) & (relu_prime_at_0 == 1.0))
    dy = torch.ones(4, 8, dtype=x.dtype)
    return {"dx": ((dy @ w2.T) * mask) @ w.T}


TARGET = Target(
    name="relu_padding",
    cases=sst.cases("relu_padding", sizes={"n": sst.Free(4, 4)}, dtypes=("float32", "float16")),
    inputs=inputs,
    oracle=oracle,
    outputs={"dx": Replicate()},
    implementations={"reference": backward, "relu_prime_at_0": bind(backward, relu_prime_at_0=1.0)},
)
