"""Dropout drawn from the global generators, on the ranks and in the oracle alike: each rank and the
driver's oracle are seeded with the case's seed (torch, Python's random, NumPy), so a replicated
mask is the same everywhere and in every run of the oracle (a new user's TP dropout probe)."""

import random

import numpy as np
import torch

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Target, bind

P = 0.5


def inputs(case):
    return {"x": torch.ones(case.sizes["n"], dtype=getattr(torch, case.dtype))}


def _mask(n, like):
    keep = torch.rand(n) >= P  # torch's global CPU generator
    shift = random.random() + float(np.random.rand())  # Python's and NumPy's: 0 to 2
    return keep.to(like.dtype), shift


def oracle(inp, case):
    x = inp["x"]
    keep, shift = _mask(x.numel(), x)
    return {"y": x * keep / (1 - P) + shift}


def dropout(ctx, *, scaled=True):
    x = ctx.inputs["x"]
    keep, shift = _mask(x.numel(), x)
    return {"y": x * keep / ((1 - P) if scaled else 1.0) + shift}


TARGET = Target(
    name="global_rng",
    cases=sst.cases("global_rng", sizes={"n": sst.Free(8, 8)}),
    inputs=inputs,
    oracle=oracle,
    outputs={"y": Replicate()},
    implementations={"reference": dropout, "unscaled": bind(dropout, scaled=False)},
)
