"""The fuzzer finds every planted bug of the TP targets, with the right failure kind, shrunk to a
minimal structure; their references pass 500 examples in float32 and in bfloat16.

Budgets: ``benchmarks/budget.py`` runs Hypothesis' generate phase with 30 seeds per bug and
reports the 95th percentile of examples-to-first-failure (P95 below, measured on the 2-core dev
machine); each test's ``max_examples`` is ``2 * p95 + 10``. Exact seeds are never pinned: only the
structure (world size, mesh, which sizes are uneven) that the bug needs.
"""

from __future__ import annotations

import pytest

from shardfuzz.layouts import split_sizes
from shardfuzz.targets import tp_mlp, vocab_parallel
from shardfuzz.testing import Expect, assert_planted_bug_found, assert_reference_passes

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

TARGETS = {"tp_mlp": tp_mlp.TARGET, "vocab_parallel": vocab_parallel.TARGET}
PLANTED = [(t, impl) for t in TARGETS for impl in TARGETS[t].planted]


def test_every_planted_bug_has_a_budget_and_an_expectation():
    assert set(PLANTED) == set(P95) == set(EXPECT)


@pytest.mark.parametrize("target,impl", PLANTED, ids=[f"{t}-{i}" for t, i in PLANTED])
def test_planted_bug_is_found_and_shrunk(target, impl):
    assert_planted_bug_found(target, impl, EXPECT[(target, impl)], p95=P95[(target, impl)])


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_has_no_false_positives(target, dtype):
    assert_reference_passes(target, dtype, examples=500)
