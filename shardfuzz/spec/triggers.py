"""Trigger conditions: where sharded-code bugs hide (``docs/triggers.md``).

The generic ones come from a case's structure (world size, mesh, uneven and empty shards, batch,
dtype, value profile); a target adds its own through ``Target(triggers=...)`` (its options: steps,
causal, top-k, ...) and ``Target(gradients=...)`` (the ``backward`` trigger). Statistics, progress
lines and the test suite all read this one vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

from shardfuzz.case import Case
from shardfuzz.spec.layouts import split_sizes

#: the generic conditions, in the order progress lines show them
GENERIC = (
    "world>=3",
    "world non-power-of-2",
    "group<world",
    "2-D mesh",
    "uneven",
    "empty shard",
    "empty DTensor shard",
    "batch>1",
    "bfloat16",
    "float64",
    "float16",
)
#: shown in campaign progress lines, in this order (when reached by the target at all)
PROGRESS = ("uneven", "world>=3", "2-D mesh", "group<world", "batch>1", "backward", "bfloat16")


def generic_triggers(case: Case) -> set[str]:
    """The generic bug-hiding conditions a case reaches."""
    out = set()
    if case.world_size >= 3:
        out.add("world>=3")
    if case.world_size >= 2 and not math.log2(case.world_size).is_integer():
        out.add("world non-power-of-2")
    if case.group_size < case.world_size:
        out.add("group<world")
    if sum(1 for m in case.mesh if m > 1) >= 2:
        out.add("2-D mesh")
    g = case.group_size
    for name in case.split:
        n = case.sizes[name]
        if n % g:
            out.add("uneven")
        if n < g:
            out.add("empty shard")  # under any split rule
        elif 0 in split_sizes(n, g, "dtensor"):
            out.add("empty DTensor shard")
    if case.sizes.get("batch", 1) > 1:
        out.add("batch>1")
    if case.dtype != "float32":
        out.add(case.dtype)
    if case.profile != "normal":
        out.add(f"profile={case.profile}")
    return out


def triggers_of(target: Any, case: Case) -> set[str]:
    """Every trigger condition ``case`` reaches for ``target``: generic, backward and declared."""
    out = generic_triggers(case)
    if target.gradients and set(target.gradients) & set(target.outputs_for(case)):
        out.add("backward")
    out.update(name for name, reached in target.triggers.items() if reached(case))
    return out
