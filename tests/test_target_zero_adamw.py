"""The ``zero_adamw`` target (flat ZeRO stages 1-3) and ``zero_adamw_torch`` (ZeroRedundancyOptimizer).

Every planted bug is found, with its failure kind, and shrunk to the structure it needs; the
strategies reach every trigger condition of BUG-PATTERNS.md that applies; the references (ours and
torch's ZeroRedundancyOptimizer) pass 500 examples in float32 and 500 in bfloat16.

Budgets: ``python benchmarks/budget.py shardfuzz.targets.zero_adamw:TARGET`` runs Hypothesis'
generate phase with 30 seeds per bug and reports the 95th percentile of examples-to-first-failure
(p95 below, measured 2026-11-30 on the 2-core dev machine). Each test's ``max_examples`` is
``2 * p95 + 10``, with the ``shardfuzz-ci`` settings (derandomized, database off).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, settings

from shardfuzz.registry import get_target
from shardfuzz.targets.zero_adamw import StepwisePaddedFlat, param_sizes
from shardfuzz.testing import Expect, assert_planted_bug_found, assert_reference_passes

SPEC = "zero_adamw"
TORCH_SPEC = "zero_adamw_torch"
TARGET = get_target(SPEC)

# p95 of examples-to-first-failure over 30 seeds (benchmarks/budget.py)
P95 = {
    "local_grad_norm": 22,
    "init_step": 1,
    "padding_on_last_rank": 28,
    "padding_in_norm": 18,
    "unscale_unscaled": 23,
    "grads_not_zeroed": 11,
}


def padding_spans_ranks(case) -> bool:
    """More padding than one rank's chunk: the padding sits on several ranks."""
    n, g = case.sizes["numel"], case.group_size
    chunk = -(-n // g)
    return chunk * g - n > chunk


EXPECT = {
    # needs a group to be local in, and an active clip
    "local_grad_norm": Expect(
        "mismatch",
        2,
        (2,),
        uneven=None,
        check=lambda c: c.options["clip_factor"] == 0.5,
        outputs=("exp_avg", "exp_avg_sq"),
    ),
    # wrong from the first step, at any world size
    "init_step": Expect(
        "mismatch", 1, (1,), uneven=None, check=lambda c: c.options["steps"] == 1, outputs=("param", "step")
    ),
    # needs padding on several ranks: 1 element on 3 ranks is [1, 0, 0]
    "padding_on_last_rank": Expect(
        "rank-error", 3, (3,), uneven=None, check=lambda c: padding_spans_ranks(c) and c.sizes["numel"] == 1
    ),
    # needs padding (an odd buffer on 2 ranks) and an active clip
    "padding_in_norm": Expect(
        "mismatch",
        2,
        (2,),
        uneven=None,
        check=lambda c: c.options["clip_factor"] == 0.5 and c.sizes["numel"] % 2 == 1,
    ),
    # bf16 only
    "unscale_unscaled": Expect(
        "mismatch",
        1,
        (1,),
        uneven=None,
        check=lambda c: c.dtype == "bfloat16",
        outputs=("exp_avg", "exp_avg_sq"),
    ),
    # needs a second optimizer step
    "grads_not_zeroed": Expect("mismatch", 1, (1,), uneven=None, check=lambda c: c.options["steps"] == 2),
}


def test_every_planted_bug_has_a_budget_and_an_expectation():
    assert set(TARGET.planted) == set(EXPECT) == set(P95)


@pytest.mark.parametrize("impl", sorted(EXPECT))
def test_planted_bug_is_found_and_shrunk(impl):
    assert_planted_bug_found(SPEC, impl, EXPECT[impl], p95=P95[impl])


@pytest.mark.parametrize("spec", [SPEC, TORCH_SPEC], ids=["flat", "torch_zero"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_has_no_false_positives(spec, dtype):
    """500 examples of the reference in each of float32 and bfloat16 (no database, derandomized)."""
    assert_reference_passes(spec, dtype, examples=500)


def _clip_active(case) -> bool:
    if case.options["clip_factor"] is None:
        return False
    inp = TARGET.inputs(case)
    a, x, p0 = (inp[k][0].double() if k != "p0" else inp[k].double() for k in ("a", "x", "p0"))
    g1 = (a * (p0 - x)).sum((0, 1)) / (a.shape[0] * case.group_size)
    return float(g1.norm()) > inp["max_norm"] > 0


TRIGGERS = {
    "clip active": _clip_active,
    "padding on several ranks": padding_spans_ranks,
    "uneven, 2 ranks": lambda c: c.group_size == 2 and c.sizes["numel"] % 2 == 1,
    "steps >= 2 with accumulation": lambda c: c.options["steps"] >= 2 and c.options["grad_accum"] >= 2,
    "stage 3 over several steps": lambda c: c.options["stage"] == 3 and c.options["steps"] >= 2,
    "several parameters across ranks": lambda c: len(param_sizes(c)) == 3 and c.group_size >= 3,
    "bf16": lambda c: c.dtype == "bfloat16",
    "group smaller than the world": lambda c: c.group_size < c.world_size,
}


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_strategy_reaches_trigger(name):
    find(TARGET.strategy(), TRIGGERS[name], settings=settings(max_examples=2000, database=None))


def test_torch_strategy_reaches_bucket_views_on_several_ranks():
    torch_target = get_target(TORCH_SPEC)
    find(
        torch_target.strategy(),
        lambda c: c.options["bucket_view"] and c.group_size >= 2 and c.options["steps"] >= 2,
        settings=settings(max_examples=2000, database=None),
    )


def test_stepwise_padded_flat_layout():
    """5 elements on 4 ranks: chunks of 2, real elements [2, 2, 1, 0], padding never compared."""
    layout = StepwisePaddedFlat()
    value = torch.arange(10.0).view(2, 5)
    assert [layout.local_shape((2, 5), r, 4) for r in range(4)] == [(2, 2)] * 4
    assert [layout.piece(value, r, 4).shape[1] for r in range(4)] == [2, 2, 1, 0]
    local = torch.tensor([[4.0, float("nan")], [9.0, float("nan")]])
    assert torch.equal(layout.comparable(local, 2, 4, (2, 5)), layout.piece(value, 2, 4))
    assert layout.global_index((1, 0), 2, 4, (2, 5)) == (1, 4)
    assert layout.assemble([torch.zeros(2, 2)] * 4).shape == (2, 8)
