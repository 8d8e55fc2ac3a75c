"""Trigger conditions: where sharded-code bugs hide (``docs/triggers.md``).

The generic ones come from a case's structure (world size, mesh, uneven and empty shards, batch,
dtype, value profile); a target adds its own through ``Target(triggers=...)`` (its options: steps,
causal, top-k, ...) and ``Target(gradients=...)`` (the ``backward`` trigger). Statistics, progress
lines and the test suite all read this one vocabulary.
"""

from __future__ import annotations

import math
import re
from typing import Any

from shardfuzz.case import EDGE_KINDS, VALUE_PROFILES, Case
from shardfuzz.errors import TargetCodeError, TargetError
from shardfuzz.spec.layouts import split_sizes

#: shards that all hold something, cut apart by DTensor's rule (torch.chunk's) and tensor_split's
SPLIT_RULES_DIFFER = "tensor_split != DTensor shards"
#: the generic conditions, in the order progress lines show them
GENERIC = (
    "world>=3",
    "world non-power-of-2",
    "group>=3",
    "group non-power-of-2",
    "group<world",
    "2-D mesh",
    "3-D mesh",
    "uneven",
    "empty shard",
    "empty DTensor shard",
    SPLIT_RULES_DIFFER,
    "uneven over replicas",
    "empty shard over replicas",
    "batch>1",
    "bfloat16",
    "float64",
    "float16",
)
#: shown in campaign progress lines, in this order (when reached by the target at all)
PROGRESS = ("uneven", "world>=3", "2-D mesh", "group<world", "batch>1", "backward", "bfloat16", "float16")
#: the conditions of :data:`PROGRESS` that name a dtype: shown only for a run that draws it
DTYPE_CONDITIONS = frozenset({"bfloat16", "float16"})


def generic_triggers(case: Case) -> set[str]:
    """The generic bug-hiding conditions a case reaches."""
    out = set()
    # the world, and the group under test (the mesh's last axis), which the world alone does not
    # say: a world of 3 on a mesh (3, 1) runs the implementation on groups of one rank
    for name, n in (("world", case.world_size), ("group", case.group_size)):
        if n >= 3:
            out.add(f"{name}>=3")
        if n >= 2 and not math.log2(n).is_integer():
            out.add(f"{name} non-power-of-2")
    if case.group_size < case.world_size:
        out.add("group<world")
    if sum(1 for m in case.mesh if m > 1) >= 2:
        out.add("2-D mesh")
    if sum(1 for m in case.mesh if m > 1) >= 3:
        out.add("3-D mesh")
    g = case.group_size
    out.update(t for name in case.split for t in _split_triggers(case.sizes[name], g))
    if case.sizes.get("batch", 1) > 1:
        out.add("batch>1")
    if case.dtype != "float32":
        out.add(case.dtype)
    if case.profile != "normal":
        out.add(f"profile={case.profile}")
    if case.profile == "edge":  # the kinds differ as much as profiles do: each is a condition of its own
        out.add(f"edge={case.options.get('edge')}")
    return out


def _split_triggers(n: int, g: int) -> set[str]:
    """What a size ``n`` split over a group of ``g`` reaches."""
    out = {"uneven"} if n % g else set()
    if n < g:
        out.add("empty shard")  # under any split rule
    elif 0 in (chunked := split_sizes(n, g, "dtensor")):
        out.add("empty DTensor shard")
    elif chunked != split_sizes(n, g, "tensor_split"):
        # every shard holds something and the two rules cut apart (7 on 3 ranks: 3, 3, 1 against
        # 3, 2, 2): offsets by one rule on shards by the other are wrong on a rank that holds
        # elements; the rules agree on 2 ranks and on 5 of 3, and an empty shard can hide the offset
        out.add(SPLIT_RULES_DIFFER)
    return out


def triggers_of(target: Any, case: Case) -> set[str]:
    """Every trigger condition ``case`` reaches for ``target``: generic, backward and declared, where
    the target's ``effective`` predicates say they are real."""
    out = generic_triggers(case)
    if case.options.get("strided") and target.layout_free:
        out.add("strided inputs")
    if target.gradients and set(target.gradients) & set(target.outputs_for(case)):
        out.add("backward")
    out |= replica_triggers(case, target.replica_splits)
    out.update(
        name
        for name, reached in target.triggers.items()
        if _hook(target, f"triggers[{name!r}]", reached, case, bool)
    )
    for name, how in target.per_group.items():
        out |= group_relations(name, quantity(target, name, how, case), case.group_size)
    return {c for c in out if is_effective(target, c, case)} if target.effective else out


def conditions_named(target: Any) -> set[str]:
    """Every condition name :func:`triggers_of` can give a case of ``target`` (what an exclusion's
    ``'uneven' in triggers`` may test)."""
    out = {*GENERIC, "strided inputs", "backward", *target.triggers}
    out |= {f"profile={p}" for p in VALUE_PROFILES if p != "normal"} | {f"edge={k}" for k in EDGE_KINDS}
    for name in target.per_group:
        out |= {f"{name}<group", f"{name}%group!=0", f"group%{name}==0"}
    return out


def conditions_met(target: Any, case: Case) -> tuple[str, ...]:
    """:func:`triggers_of` in a reader's order: the generic conditions as :data:`GENERIC` lists
    them, then ``backward`` and the target's own as it declares them, then the rest sorted (its
    ``per_group`` relations, the value profile). A finding's report names them: a shrunk case that
    has ``kv_heads%group!=0`` says the cause."""
    met = triggers_of(target, case)
    order = [*GENERIC, "strided inputs", "backward", *target.triggers]
    return tuple(dict.fromkeys([c for c in order if c in met] + sorted(met - set(order))))


def replica_triggers(case: Case, names: frozenset[str]) -> set[str]:
    """What the sizes a target splits over the replicas of a dp x tp mesh (``Split(over="replicas")``,
    not in ``case.split``) reach: a batch the replicas do not divide hides a mean of means; fewer
    rows than replicas leaves one without any (a new user's 2-D halo exchange could not tell
    whether an empty row shard was ever drawn)."""
    replicas = case.world_size // case.group_size
    out = set()
    if replicas >= 2 and any(case.sizes.get(n, 0) % replicas for n in names):
        out.add("uneven over replicas")
    if replicas >= 2 and any(case.sizes.get(n, replicas) < replicas for n in names):
        out.add("empty shard over replicas")
    return out


def group_relations(name: str, q: int, g: int) -> set[str]:
    """How a quantity ``q`` relates to a group of ``g`` ranks (``Target(per_group=...)``)."""
    if g < 2:
        return set()
    out = {f"{name}<group"} if q < g else set()
    if q % g:
        out.add(f"{name}%group!=0")
    if 1 < q < g and g % q == 0:
        out.add(f"group%{name}==0")
    return out


def quantity(target: Any, name: str, how: Any, case: Case) -> int:
    """The value of a ``per_group`` quantity on ``case``: a size, an option, or a callable's."""
    if callable(how):
        return _hook(target, f"per_group[{name!r}]", how, case, int)
    for where in (case.sizes, case.options):
        if how in where:
            return int(where[how])
    raise TargetError(
        f"Target {target.name!r}: per_group[{name!r}]={how!r} is neither a size ({sorted(case.sizes)}) "
        f"nor an option ({sorted(case.options)}) of {case!r}"
    )


def is_effective(target: Any, condition: str, case: Case) -> bool:
    """Whether ``condition`` is real on ``case`` (``Target(effective=...)``: the condition's own
    predicate, else its option's, for an ``option=value`` condition; true without either)."""
    effective = target.effective
    if not effective:
        return True
    pred = effective.get(condition)
    if pred is None:
        option = re.match(r"([A-Za-z_]\w*)=", condition)
        pred = effective.get(option.group(1)) if option else None
    return pred is None or _hook(target, f"effective[{condition!r}]", pred, case, bool)


def _hook(target: Any, piece: str, fn: Any, case: Case, kind: Any) -> Any:
    """``kind(fn(case))``, a predicate or quantity of the target's; what it raises is the target's error
    (exit 2 with its traceback), not the fuzzer's: a new user's per_group function raised KeyError
    on a case an ``--option`` pinned out of its range, and the CLI said "the fuzzer itself failed"."""
    try:
        return kind(fn(case))  # bool or int of what it returns: None for a count raises here too
    # any exception: whatever the target's own code raises, or its value's conversion
    except Exception as e:
        raise TargetCodeError.of(target.name, f"{piece}(case)", case, e) from e
