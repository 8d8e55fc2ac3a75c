"""Helpers to prove that a fuzz target works: its planted bugs are found and shrink to a minimal
structure, and its reference passes. The built-in targets' tests use them; so can yours.

    from shardfuzz.testing import Expect, assert_planted_bug_found, assert_reference_passes

    def test_mean_of_means_is_found():
        assert_planted_bug_found("my_target.py", "mean_of_means", Expect("mismatch", 2, (2,), uneven=("rows",)), p95=20)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from shardfuzz.case import Case
from shardfuzz.engine import Result, run
from shardfuzz.registry import get_target


@dataclasses.dataclass
class Expect:
    """What the shrunk counterexample of a planted bug must look like (structure, never seeds).

    Attributes:
        kind: the failure kind ("mismatch", "layout", "rank-error", "hang", "ignored-collective").
        world_size, mesh: the smallest world size and mesh that trigger the bug (``world_size`` may
            be a tuple of accepted sizes, with ``mesh=None`` meaning the 1-D mesh).
        uneven: the split sizes that must be uneven in the minimal case; all others must be even
            (``None``: not checked, when ``check`` accepts several minimal forms).
        check: an extra structural predicate on the case.
        outputs: for mismatches, exactly these outputs are wrong (e.g. only a gradient), or a
            predicate on the tuple of wrong outputs.
        timeout: a fixed example timeout (hang bugs: keep it short).
    """

    kind: str
    world_size: int | tuple[int, ...]
    mesh: tuple[int, ...] | None
    uneven: tuple[str, ...] | None = ()
    check: Callable[[Case], bool] | None = None
    outputs: tuple[str, ...] | Callable[[tuple[str, ...]], bool] | None = None
    timeout: float | None = None


def uneven_sizes(case: Case) -> tuple[str, ...]:
    """The split sizes that the implementation's group size does not divide."""
    return tuple(n for n in case.split if case.sizes[n] % case.group_size)


def budget(p95: int) -> int:
    """The example budget for a planted-bug test: twice the 95th percentile of examples-to-failure
    over 30 seeds (``benchmarks/budget.py`` measures it), plus 10."""
    return 2 * p95 + 10


def assert_planted_bug_found(target: Any, impl: str, expect: Expect, *, p95: int) -> Result:
    """Run the ``shardfuzz-ci`` settings (derandomized, database off) and check the finding."""
    result = run(
        target, impl, profile="shardfuzz-ci", database=None, max_examples=budget(p95), timeout=expect.timeout
    )
    name = f"{get_target(target).name}/{impl}"
    assert result.found, f"{name} not found in {budget(p95)} examples: {result.stats.summary()}"
    assert result.kind == expect.kind, result.report
    case = result.case
    worlds = expect.world_size if isinstance(expect.world_size, tuple) else (expect.world_size,)
    mesh = expect.mesh if expect.mesh is not None else (case.world_size,)
    assert case.world_size in worlds and case.mesh == mesh, result.report
    if expect.uneven is not None:
        assert uneven_sizes(case) == tuple(expect.uneven), result.report
    if expect.check is not None:
        assert expect.check(case), result.report
    if expect.outputs is not None:
        wrong = tuple(result.failures[0].outputs)
        ok = expect.outputs(wrong) if callable(expect.outputs) else wrong == tuple(expect.outputs)
        assert ok, result.report
    if result.stats.margin is not None:
        print(f"{name}: {case!r}, margin {result.stats.margin:.3g}x")
    return result


def assert_reference_passes(target: Any, dtype: str, *, examples: int = 500, impl: Any = None) -> Result:
    """``examples`` cases of the reference, all in ``dtype``, with no false positive."""
    t = get_target(target)
    only = dataclasses.replace(t, cases=t.strategy().map(lambda c: dataclasses.replace(c, dtype=dtype)))
    result = run(only, impl, profile="shardfuzz-ci", database=None, max_examples=examples)
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= examples, result.stats.summary()
    print(f"{t.name} {dtype}: worst passing error/tolerance {result.stats.worst_pass_ratio:.3g}")
    return result
