"""The ``ring_attention`` target: every planted bug is found, with its failure kind, and shrunk to a
minimal structure; the reference has no false positives; the strategy reaches the trigger conditions.

Budgets: ``python benchmarks/budget.py shardfuzz.targets.ring_attention:TARGET`` runs Hypothesis'
generate phase with 30 seeds per bug and reports the 95th percentile of examples-to-first-failure
(p95 below, measured on the 2-core dev machine). Each test's ``max_examples`` is ``2 * p95 + 10``.
The tests run the ``shardfuzz-ci`` settings (derandomized, database off). Exact seeds are never
pinned: only the structure (world size, mesh, which sizes are uneven, what else the bug needs).
"""

from __future__ import annotations

import pytest
from hypothesis import find, settings

from shardfuzz.layouts import split_sizes
from shardfuzz.targets.ring_attention import TARGET
from shardfuzz.testing import Expect, assert_planted_bug_found, assert_reference_passes, uneven_sizes

SPEC = "ring_attention"
GRADS = {"grad_q", "grad_k", "grad_v", "zz_grad_q", "zz_grad_k", "zz_grad_v"}

# p95 of examples-to-first-failure over 30 seeds (benchmarks/budget.py)
P95 = {
    "naive_merge": 28,
    "causal_every_step": 29,
    "zigzag_inverted_branch": 42,
    "stale_kv_backward": 10,
    "reversed_ring": 19,
}


variant = lambda c: c.options["variant"]

EXPECT = {
    # a large logit gap between the blocks' LSEs (a drawn logit_scale, or the 'large' profile)
    "naive_merge": Expect(
        "mismatch",
        2,
        (2,),
        check=lambda c: variant(c) == "full" and (c.options["logit_scale"] > 1 or c.profile == "large"),
    ),
    # the off-diagonal block must be wider than one key: seq 3 on 2 ranks is [2, 1]
    "causal_every_step": Expect(
        "mismatch", 2, (2,), uneven=("seq",), check=lambda c: variant(c) == "causal" and c.sizes["seq"] == 3
    ),
    "zigzag_inverted_branch": Expect(
        "mismatch",
        2,
        (2,),
        check=lambda c: variant(c) == "zigzag",
        outputs=lambda outs: all(o.startswith("zz_") for o in outs),
    ),
    # backward only: out and lse are right
    "stale_kv_backward": Expect(
        "mismatch", 2, (2,), check=lambda c: variant(c) == "full", outputs=lambda outs: set(outs) <= GRADS
    ),
    # right at exactly 2 ranks (previous == next); at 3 it needs the causal bookkeeping, or uneven
    # blocks (read with the wrong source's length) in the non-causal variant: either is minimal
    "reversed_ring": Expect(
        "mismatch",
        3,
        (3,),
        uneven=None,
        check=lambda c: (
            (variant(c) == "causal" and not uneven_sizes(c))
            or (variant(c) == "full" and uneven_sizes(c) == ("seq",))
        ),
    ),
}


def test_every_planted_bug_has_a_budget_and_an_expectation():
    assert set(TARGET.planted) == set(EXPECT) == set(P95)


@pytest.mark.parametrize("impl", list(P95))
def test_planted_bug_is_found_and_shrunk(impl):
    assert_planted_bug_found(SPEC, impl, EXPECT[impl], p95=P95[impl])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_has_no_false_positives(dtype):
    """500 examples of the reference in each of float32 and bfloat16 (no database, derandomized)."""
    assert_reference_passes(SPEC, dtype, examples=500)


# -- the strategy reaches every trigger condition of BUG-PATTERNS.md that applies ----------------
STRATEGY = TARGET.strategy()
TRIGGERS = {
    "causal on exactly 3 ranks": lambda c: variant(c) == "causal" and c.world_size == 3,
    "zigzag on 4 ranks": lambda c: variant(c) == "zigzag" and c.world_size == 4,
    "zigzag on 3 ranks": lambda c: variant(c) == "zigzag" and c.world_size == 3,
    "group smaller than the world (dp x sp = 2 x 2)": lambda c: c.mesh == (2, 2),
    "batch 1 with sp > 1": lambda c: c.sizes["batch"] == 1 and c.group_size > 1,
    "batch > 1 with sp > 1": lambda c: c.sizes["batch"] > 1 and c.group_size > 1,
    "uneven sequence on 3 ranks": lambda c: c.group_size == 3 and c.sizes["seq"] % 3,
    "an empty DTensor shard (causal)": lambda c: (
        variant(c) == "causal" and 0 in split_sizes(c.sizes["seq"], c.group_size)
    ),
    "an empty zigzag chunk": lambda c: variant(c) == "zigzag" and c.sizes["seq"] < 2 * c.group_size,
    "logit gap: logit_scale 100 on 3 ranks": lambda c: c.options["logit_scale"] == 100 and c.group_size == 3,
    "bf16 with sp > 1": lambda c: c.dtype == "bfloat16" and c.group_size > 1,
    "fp32 with sp > 1": lambda c: c.dtype == "float32" and c.group_size > 1,
    "large magnitudes": lambda c: c.profile == "large" and c.options["scale"] >= 1000,
    "ties": lambda c: c.profile == "ties",
}


@pytest.mark.parametrize("name", list(TRIGGERS))
def test_strategy_reaches_trigger(name):
    case = find(STRATEGY, TRIGGERS[name], settings=settings(max_examples=3000, database=None, deadline=None))
    assert TRIGGERS[name](case)


def test_backward_is_always_checked():
    assert GRADS <= set(TARGET.outputs)
