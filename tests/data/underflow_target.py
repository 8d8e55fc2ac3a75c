"""A float16 dot product over a sharded dim, then an Adam-like normalisation: each rank's partial
underflows to 0 where the whole sum does not (a new user's ZeRO-3 reference, cut down). Correct
float16 arithmetic that the noise model must allow: a rounding errs by up to ``u * (|x| + tiny)``."""

import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target

EPS = 2.0**-20  # a float16 subnormal: the oracle's float16 run keeps it


def inputs(case):
    n = case.sizes["k"]
    return {  # products of 2^-26, below half float16's smallest subnormal (2^-24)
        "a": torch.full((n,), 2.0**-13, dtype=torch.float16) * 1.25,
        "b": torch.full((n,), 2.0**-13, dtype=torch.float16),
    }


def oracle(inp, case):
    s = (inp["a"] @ inp["b"]).reshape(1)  # accumulated wider, rounded once
    return {"update": s / (s.abs() + EPS)}


def reference(ctx):
    s = (ctx.local["a"] @ ctx.local["b"]).reshape(1)  # float16: each partial rounds to the subnormal grid
    dist.all_reduce(s, group=ctx.group)
    return {"update": s / (s.abs() + EPS)}


TARGET = Target(
    name="underflow",
    cases=sst.cases("underflow", sizes={"k": sst.Split()}, dtypes=("float16",)),
    inputs=inputs,
    oracle=oracle,
    outputs={"update": Replicate()},
    input_layouts={"a": Shard(0), "b": Shard(0)},
    implementations={"reference": reference},
)
