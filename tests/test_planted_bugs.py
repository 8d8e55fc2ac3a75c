"""The fuzzer finds every planted bug, with the right failure kind, shrunk to a minimal structure.

Budgets: ``benchmarks/budget.py`` runs Hypothesis' generate phase with 30 seeds per bug and
reports the 95th percentile of examples-to-first-failure (p95 below, measured 2026-11-30 on the
2-core dev machine). Each test's ``max_examples`` is ``2 * p95 + 10``. The tests run the
``shardfuzz-ci`` settings (derandomized, database off). Exact seeds are never pinned: only the
structure (world size, mesh, which sizes are uneven) that the bug needs.
"""

from __future__ import annotations

import dataclasses

import pytest

import shardfuzz
from shardfuzz.layouts import split_sizes
from shardfuzz.registry import BUILTIN_TARGETS, get_target

# p95 of examples-to-first-failure over 30 seeds (benchmarks/budget.py)
P95 = {
    ("tp_mlp", "missing_allreduce"): 2,
    ("tp_mlp", "bias_before_allreduce"): 2,
    ("tp_mlp", "missing_f_backward"): 2,
    ("tp_mlp", "world_group"): 29,
    ("tp_mlp", "floor_split"): 65,
    ("tp_mlp", "contiguous_copy"): 11,
    ("tp_mlp", "skip_empty_shard"): 155,
    ("tp_mlp", "raw_allreduce"): 1,
    ("vocab_parallel", "local_smoothing"): 8,
    ("vocab_parallel", "embedding_no_offset"): 11,
}


@dataclasses.dataclass
class Expect:
    kind: str
    world_size: int
    mesh: tuple
    uneven: tuple = ()  # split sizes that must be uneven in the minimal case; the others even
    check: object = None  # extra structural check on the case
    outputs: tuple | None = None  # for mismatches: exactly these outputs are wrong
    timeout: float | None = None


def uneven_names(case):
    return tuple(n for n in case.split if case.sizes[n] % case.group_size)


EXPECT = {
    ("tp_mlp", "missing_allreduce"): Expect("mismatch", 2, (2,), outputs=("y",)),
    ("tp_mlp", "bias_before_allreduce"): Expect("mismatch", 2, (2,), outputs=("y",)),
    # wrong only in backward: the forward output is right
    ("tp_mlp", "missing_f_backward"): Expect("mismatch", 2, (2,), outputs=("grad_x",)),
    # right on every 1-D mesh: needs a TP group smaller than the world
    ("tp_mlp", "world_group"): Expect("mismatch", 2, (2, 1)),
    # right on even sizes
    ("tp_mlp", "floor_split"): Expect("layout", 2, (2,), uneven=("hidden",)),
    # batch * seq == 1 (or d_out == 1) keeps the output contiguous and hides it
    ("tp_mlp", "contiguous_copy"): Expect(
        "mismatch",
        2,
        (2,),
        check=lambda c: c.sizes["batch"] * c.sizes["seq"] == 2 and c.sizes["d_out"] == 2,
        outputs=("y",),
    ),
    # needs an empty DTensor shard: 4 rows on 3 ranks are [2, 2, 0]
    ("tp_mlp", "skip_empty_shard"): Expect(
        "hang",
        3,
        (3,),
        uneven=("hidden",),
        check=lambda c: 0 in split_sizes(c.sizes["hidden"], 3),
        timeout=2.0,
    ),
    # an ignored collective is wrong at any world size
    ("tp_mlp", "raw_allreduce"): Expect("ignored-collective", 1, (1,)),
    # tp > 1 and smoothing > 0
    ("vocab_parallel", "local_smoothing"): Expect(
        "mismatch", 2, (2,), check=lambda c: c.options["smoothing"] == 0.1
    ),
    # rank 0 is right: needs a second rank holding 2+ rows (with one row the clamp hides it)
    ("vocab_parallel", "embedding_no_offset"): Expect(
        "mismatch", 2, (2,), check=lambda c: c.options["smoothing"] == 0.0 and c.sizes["vocab"] == 4
    ),
}

PLANTED = [(t, impl) for t in sorted(BUILTIN_TARGETS) for impl in get_target(t).planted]


def test_every_planted_bug_has_a_budget_and_an_expectation():
    assert set(PLANTED) == set(P95) == set(EXPECT)


@pytest.mark.parametrize("target,impl", PLANTED, ids=[f"{t}-{i}" for t, i in PLANTED])
def test_planted_bug_is_found_and_shrunk(target, impl, record_property):
    exp = EXPECT[(target, impl)]
    budget = 2 * P95[(target, impl)] + 10
    result = shardfuzz.run(
        target, impl, profile="shardfuzz-ci", database=None, max_examples=budget, timeout=exp.timeout
    )
    assert result.found, f"{target}/{impl} not found in {budget} examples: {result.stats.summary()}"
    assert result.kind == exp.kind, result.report
    case = result.case
    assert (case.world_size, case.mesh) == (exp.world_size, exp.mesh), result.report
    assert uneven_names(case) == exp.uneven, result.report
    if exp.check is not None:
        assert exp.check(case), result.report
    if exp.outputs is not None:
        assert tuple(result.failures[0].outputs) == exp.outputs, result.report
    if result.stats.margin is not None:
        record_property("margin", result.stats.margin)
        print(f"{target}/{impl}: margin {result.stats.margin:.3g}x")


@pytest.mark.parametrize("target", sorted(BUILTIN_TARGETS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_has_no_false_positives(target, dtype):
    """500 examples of the reference in each of float32 and bfloat16 (no database, derandomized)."""
    t = get_target(target)
    only = dataclasses.replace(t, cases=t.strategy().map(lambda c: dataclasses.replace(c, dtype=dtype)))
    result = shardfuzz.run(only, profile="shardfuzz-ci", database=None, max_examples=500)
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= 500
    print(f"{target} {dtype}: worst passing error/tolerance {result.stats.worst_pass_ratio:.3g}")
