"""The ``ulysses`` target: every planted bug is found, with its failure kind, and shrunk to a minimal
structure; the reference has no false positives; the strategy reaches the trigger conditions.

Budgets: ``python benchmarks/budget.py shardfuzz.targets.ulysses:TARGET`` runs Hypothesis' generate
phase with 30 seeds per bug and reports the 95th percentile of examples-to-first-failure (p95 below,
measured on the 2-core dev machine). Each test's ``max_examples`` is ``2 * p95 + 10``. The tests run
the ``shardfuzz-ci`` settings (derandomized, database off). Exact seeds are never pinned: only the
structure (world size, mesh, which sizes are uneven, what else the bug needs).
"""

from __future__ import annotations

import pytest
from hypothesis import find, settings

from shardfuzz.targets.ulysses import TARGET
from shardfuzz.testing import Expect, assert_planted_bug_found, assert_reference_passes

SPEC = "ulysses"
GRADS = {"grad_q", "grad_k", "grad_v"}

# p95 of examples-to-first-failure over 30 seeds (benchmarks/budget.py)
P95 = {
    "a2a_reshape": 41,
    "local_rope_positions": 33,
    "gqa_pad_separately": 45,
    "bf16_grad_a2a": 6,
}


EXPECT = {
    # batch 1 hides it; seq 3 on 2 ranks is [2, 1]: rank 0 receives 2 tokens per chunk
    "a2a_reshape": Expect(
        "mismatch", 2, (2,), uneven=("seq",), check=lambda c: c.sizes["batch"] == 2 and c.sizes["seq"] == 3
    ),
    # rank 0 is right; needs one rotary pair (head_dim 2) and a second rank
    "local_rope_positions": Expect(
        "mismatch", 2, (2,), check=lambda c: c.sizes["head_dim"] == 2 and c.sizes["seq"] == 2
    ),
    # needs kv_heads % sp != 0 and real GQA (q_per_kv >= 2): 1 KV head, 2 Q heads, sp 2
    "gqa_pad_separately": Expect(
        "mismatch", 2, (2,), check=lambda c: c.sizes["kv_heads"] == 1 and c.sizes["q_per_kv"] == 2
    ),
    # backward only, fp32 (bf16 runs cannot see a bf16 cast); sp 1 has no all-to-all
    "bf16_grad_a2a": Expect(
        "mismatch",
        2,
        (2,),
        check=lambda c: c.dtype == "float32",
        outputs=lambda outs: set(outs) <= GRADS,
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
HQ = lambda c: c.sizes["kv_heads"] * c.sizes["q_per_kv"]
TRIGGERS = {
    "exactly 3 ranks": lambda c: c.world_size == 3,
    "4 ranks": lambda c: c.world_size == 4,
    "group smaller than the world (dp x sp = 2 x 2)": lambda c: c.mesh == (2, 2),
    "batch 1 with sp > 1": lambda c: c.sizes["batch"] == 1 and c.group_size > 1,
    "batch > 1 with sp > 1": lambda c: c.sizes["batch"] > 1 and c.group_size > 1,
    "uneven sequence on 3 ranks": lambda c: c.group_size == 3 and c.sizes["seq"] % 3,
    "kv_heads < sp with GQA": lambda c: c.sizes["kv_heads"] < c.group_size and c.sizes["q_per_kv"] > 1,
    "kv_heads % sp != 0 with kv_heads > sp": lambda c: (
        c.sizes["kv_heads"] > c.group_size > 1 and c.sizes["kv_heads"] % c.group_size
    ),
    "heads % sp != 0 on 3 ranks": lambda c: c.group_size == 3 and HQ(c) % 3,
    "odd head_dim (partial rotary)": lambda c: c.sizes["head_dim"] == 3,
    "causal on 4 ranks": lambda c: c.options["causal"] and c.group_size == 4,
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
