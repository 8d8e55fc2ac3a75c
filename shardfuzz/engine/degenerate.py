"""Inputs that hide bugs: does a case give a degenerate output, or saturate a softmax?

An output that is all zero or constant, or computed through a softmax saturated to one-hot,
compares equal whatever the implementation does to it: a wrong reduction of zeros is zeros, and a
zero-padded key under a one-hot softmax gets weight 0 with or without its mask. A target whose
strategy draws many such cases finds fewer bugs than its example count says.
:func:`degenerate_share` measures it on the oracle (float64, on this process), over cases drawn
at random from the target's strategy; ``tests/test_targets.py`` keeps it under 5% per built-in
target.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from hypothesis.strategies import SearchStrategy
from torch.utils._python_dispatch import TorchDispatchMode

from shardfuzz.case import Case
from shardfuzz.errors import InvalidArgument, Unsupported
from shardfuzz.verdict.oracle import evaluate_oracle, supports

#: a softmax row whose largest probability is within this of 1 is one-hot
ONE_HOT = 1e-6

_SOFTMAX = {torch.ops.aten._softmax.default, torch.ops.aten._safe_softmax.default}
_LOG_SOFTMAX = {torch.ops.aten._log_softmax.default}


class SoftmaxWatch(TorchDispatchMode):
    """Records whether any softmax over 2+ elements came out one-hot in every row."""

    def __init__(self) -> None:
        super().__init__()
        self.saturated = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _SOFTMAX or func in _LOG_SOFTMAX:
            dim = args[1]
            if out.numel() and out.shape[dim] > 1:
                p = out.exp() if func in _LOG_SOFTMAX else out
                if bool((p.amax(dim) > 1 - ONE_HOT).all()):
                    self.saturated = True
        return out


def is_degenerate(value: Any) -> bool:
    """All zero, or (2+ elements) all equal. A constant whole-number output is a counter (a step
    count, token ids), exact by design, and not counted; an all-zero one always is."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
        return False
    v = value.detach()
    if bool((v == 0).all()):
        return True
    constant = v.numel() > 1 and bool((v == v.flatten()[0]).all())
    return constant and not bool((v == v.round()).all())


@dataclasses.dataclass(frozen=True)
class Degenerate:
    """What made one case degenerate: its degenerate outputs and whether a softmax saturated."""

    outputs: tuple[str, ...]
    saturated_softmax: bool

    def __bool__(self) -> bool:
        return bool(self.outputs) or self.saturated_softmax


def degenerate(target: Any, case: Case) -> Degenerate:
    """The degenerate outputs of ``target``'s oracle on ``case`` (in float64)."""
    watch = SoftmaxWatch()
    with watch:
        expected = evaluate_oracle(target, case)
    outs = tuple(name for name in target.outputs_for(case) if is_degenerate(expected.ref.get(name)))
    return Degenerate(outs, watch.saturated)


@dataclasses.dataclass(frozen=True)
class DegenerateShare:
    """Over ``cases`` supported cases, how many were degenerate, and by what."""

    cases: int
    degenerate: int
    by_cause: dict[str, int]

    @property
    def share(self) -> float:
        return self.degenerate / self.cases if self.cases else 0.0


def degenerate_share(target: Any, cases: Iterable[Case]) -> DegenerateShare:
    """:func:`degenerate` over ``cases`` (those ``target.supports`` or the oracle rejects are
    skipped: no run checks them either)."""
    if isinstance(cases, SearchStrategy):  # was "'LazyStrategy' object is not iterable" (a new user)
        raise InvalidArgument(
            f"degenerate_share(target, cases={cases!r}): cases must be Case objects, e.g. a list drawn "
            "with [strategy.example() for _ in range(200)], not the strategy itself"
        )
    n = bad = 0
    causes: Counter[str] = Counter()
    for case in cases:
        if target.supports is not None and supports(target, case):
            continue
        try:
            found = degenerate(target, case)
        except Unsupported:  # the oracle refuses it (a value out of the case dtype's range)
            continue
        n += 1
        if found:
            bad += 1
            causes.update(found.outputs)
            causes.update(["softmax one-hot"] if found.saturated_softmax else [])
    return DegenerateShare(n, bad, dict(causes))


def same_values(v: Any, w: Any) -> bool:
    """Whether two inputs are the same values: tensors bit for bit (dtype and shape too), lists,
    tuples and dicts item by item, anything else by ``==`` where that gives one answer."""
    if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor):
        return (
            isinstance(v, torch.Tensor)
            and isinstance(w, torch.Tensor)
            and v.dtype == w.dtype
            and v.shape == w.shape
            and torch.equal(v, w)
        )
    if isinstance(v, (list, tuple)) and isinstance(w, (list, tuple)):
        return type(v) is type(w) and len(v) == len(w) and all(same_values(x, y) for x, y in zip(v, w))
    if isinstance(v, dict) and isinstance(w, dict):
        return v.keys() == w.keys() and all(same_values(v[k], w[k]) for k in v)
    same = v == w
    return same if isinstance(same, bool) else False  # an array's elementwise answer: not one


def inert_profiles(target: Any, profile_samples: dict[str, list[Case]], passes: Counter) -> dict[str, int]:
    """The value profiles (not ``normal``) under which the target's inputs came out exactly as under
    ``normal`` in every sampled passing case, with their passing examples: those examples repeat
    normal-profile cases. A target that gives every tensor a role the profile leaves alone (``large``
    scales activations and cotangents only: a new user's attention target, its input a ``logits``
    tensor and its cotangent unprofiled, drew ``large`` in a quarter of its examples, each exactly
    a ``normal`` one), or builds its inputs without shardfuzz's helpers, gets none of them."""
    inert = {}
    for profile, cases in profile_samples.items():
        if profile == "normal" or not cases:
            continue
        same, seen = True, False
        for case in cases:
            drawn = target.inputs(case)
            if all(t.numel() == 0 for t in drawn.values() if isinstance(t, torch.Tensor)):
                continue  # nothing a profile could change: no evidence (said as an empty pass)
            # its options kept: the normal profile reads none of them, and a target may
            normal = dataclasses.replace(case, profile="normal")
            seen = True
            if not same_values(drawn, target.inputs(normal)):
                same = False
                break
        if same and seen:
            inert[profile] = passes[profile]
    return inert
