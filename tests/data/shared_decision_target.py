"""Top-1 routing with a decision shared by the oracle and the ranks, on exact ties: the router's
two columns are equal, so every token's two scores tie, and the stated rule (``argmax``: the lower
expert) picks expert 0. ``higher_on_ties`` breaks them toward expert 1: a tie-rule bug that shows
in ``y``. ``TARGET`` makes the decision inside ``shardfuzz.decision()``, ``UNMARKED`` the same
without it (its noise samples flip the oracle's ties, and the bound on ``y`` takes in both experts)."""

import torch

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target, bind
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    g, n = generator(case), case.sizes["tokens"]
    return {
        "x": randn(case, n, 2, gen=g),
        "router": torch.ones(2, 2, dtype=getattr(torch, case.dtype)),  # equal columns: every token ties
        "experts": randn(case, 2, 2, 2, gen=g, role="weight"),
    }


def route(x, router, higher=False):
    """The expert of each token, from the case-dtype values in float64 (the shared decision)."""
    scores = x.detach().double() @ router.detach().double()
    return (scores.shape[-1] - 1 - scores.flip(-1).argmax(-1)) if higher else scores.argmax(-1)


def marked_route(x, router, higher=False):
    with shardfuzz.decision():
        return route(x, router, higher)


def oracle_with(choose):
    def oracle(inp, case):
        x, experts = inp["x"], inp["experts"]
        idx = choose(x, inp["router"])
        return {"y": torch.einsum("nd,nde->ne", x, experts[idx])}

    return oracle


def reference(ctx, *, marked=True, higher=False):
    x, experts = ctx.local["x"], ctx.local["experts"]
    idx = (marked_route if marked else route)(x, ctx.local["router"], higher)
    return {"y": torch.einsum("nd,nde->ne", x, experts[idx])}


def _cases(world_sizes=None):
    return sst.cases("shared_decision", sizes={"tokens": sst.Split()}, world_sizes=world_sizes)


TARGET = Target(
    name="shared_decision",
    cases=_cases,
    inputs=inputs,
    oracle=oracle_with(marked_route),
    outputs={"y": Shard(0)},
    input_layouts={"x": Shard(0), "router": Replicate(), "experts": Replicate()},
    implementations={"reference": reference, "higher_on_ties": bind(reference, higher=True)},
)
UNMARKED = TARGET.derive(
    name="shared_decision_unmarked",
    oracle=oracle_with(route),
    implementations={
        "reference": bind(reference, marked=False),
        "higher_on_ties": bind(reference, marked=False, higher=True),
    },
)
