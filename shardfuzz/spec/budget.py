"""Communication budgets, as a target declares them: ``Target(comm={"reference": fn})`` with
``fn(case) -> CommBudget``, and the byte formulas a budget is written with (``all_reduce_bytes``,
``all_gather_bytes``, :data:`ITEMSIZE`). Whether a case kept its budget is decided from the
collective trace by :mod:`shardfuzz.verdict.comm`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from shardfuzz.errors import InvalidArgument

ITEMSIZE = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CommBudget:
    """An upper bound on what one rank may communicate in one case, declared per implementation
    (``Target(comm={"reference": fn})``, ``fn(case) -> CommBudget``). ``sent``: bytes sent per
    rank, by the module's formulas; ``collectives``: collectives entered per rank; ``largest``: the
    size ``S`` in bytes of the largest single collective a rank may enter (a bucket cap: one big
    collective in place of several small ones sends the same bytes); ``why``: the formula in
    words, for the report."""

    sent: float | None = None
    collectives: int | None = None
    largest: float | None = None
    why: str = ""


def all_reduce_bytes(numel: int, n: int, dtype: str) -> float:
    """Bytes one rank sends in a ring all-reduce of ``numel`` elements on ``n`` ranks."""
    return 2 * (n - 1) / n * numel * ITEMSIZE[dtype] if n > 1 else 0.0


def all_gather_bytes(numel_out: int, n: int, dtype: str) -> float:
    """Bytes one rank sends in an all-gather (or reduce-scatter) of ``numel_out`` elements in all."""
    return (n - 1) / n * numel_out * ITEMSIZE[dtype] if n > 1 else 0.0


BudgetFn = Callable[[Any], CommBudget]


def check_budgets(comm: Any, target: str, implementations: Mapping[str, Any]) -> dict[str, BudgetFn]:
    """``Target(comm=...)`` checked: implementation name -> ``fn(case) -> CommBudget``."""
    if not isinstance(comm, (Mapping, tuple)):
        raise InvalidArgument(
            f"Target {target!r}: comm={comm!r}; must be a mapping name -> fn(case) -> CommBudget"
        )
    out = {}
    for name, fn in dict(comm or {}).items():
        if name not in implementations or not callable(fn):
            raise InvalidArgument(
                f"Target {target!r}: comm[{name!r}]={fn!r}; must map an implementation name "
                f"({', '.join(implementations)}) to fn(case) -> CommBudget"
            )
        out[name] = fn
    return out


def budget_for(target: Any, impl_name: str) -> BudgetFn | None:
    """The budget function of an implementation: its own, else (a planted bug or expected failure
    made from the reference) the reference's."""
    comm = target.comm
    if impl_name in comm:
        return comm[impl_name]
    rec = target.planted.get(impl_name) or target.expected_failures.get(impl_name)
    return comm.get(target.reference) if rec is not None and rec.impl is None else None
