"""The pipeline_1f1b target's schedule as data: the order check and the unit-clock bubble count
against (P - 1) / (M + P - 1), on the simulator alone and on the orders the reference and torch's
schedules really ran. The planted bugs themselves are proved by tests/test_targets.py."""

from fractions import Fraction

import pytest

from shardfuzz import Case, Mismatch, Runner, Unsupported
from shardfuzz.targets.pipeline_1f1b import KINDS, order_problem, simulate, stage_steps


def _orders(kind, p, m, bug=None):
    return [stage_steps(kind, p, m, s, bug) for s in range(p)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_p_and_m_gives_the_formulas_bubble(kind):
    for p in range(1, 5):
        for m in range(1, 7):  # M < P included: the 1F1B warm-up is clamped to M
            orders = _orders(kind, p, m)
            assert order_problem(kind, m, orders) is None, (p, m)
            idle, span = simulate(orders)
            assert span == 2 * (m + p - 1) and idle == 2 * p * (p - 1), (p, m, idle, span)
            assert Fraction(idle, p * span) == Fraction(p - 1, m + p - 1)


def test_a_hand_timed_two_stage_1f1b():
    # stage 0: F0 F1 . B0 . B1, stage 1: . F0 B0 F1 B1 . (slots 0-5): 4 idle slots of 12
    orders = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    assert order_problem("1f1b", 2, orders) is None
    assert simulate(orders) == (4, 6)
    assert "1F1B with 1 warm-up forwards runs FFBB" in order_problem("1f1b", 2, orders[::-1])


def test_wrong_orders_are_named_and_a_cycle_deadlocks():
    assert "GPipe runs every forward" in order_problem("gpipe", 2, _orders("1f1b", 1, 2))
    assert "0 warm-up forwards runs FBFB, not FFBB" in order_problem(
        "1f1b", 2, _orders("1f1b", 1, 2, "warmup_p")
    )
    assert "did not run each forward and backward once" in order_problem("gpipe", 1, [[("F", 0)]])
    assert "out of micro-batch order" in order_problem("gpipe", 2, [[("F", 1), ("F", 0), ("B", 0), ("B", 1)]])
    # the larger warm-up is a valid pipeline with a longer clock than the formula's
    idle, span = simulate(_orders("1f1b", 3, 4, "warmup_p"))
    assert span == 12 and idle == 3 * 12 - 3 * 8
    # stage 1 backwards micro-batch 0 before stage 0 has forwarded it: nothing can move
    assert simulate([[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]) is None


def _case(kind, p, m, dtype="float32"):
    return Case(
        target="pipeline_1f1b", world_size=p, mesh=(p,), split=("layers",), dtype=dtype,
        sizes={"layers": p + 1, "rows": 2, "hidden": 3}, options={"kind": kind, "microbatches": m},
    )  # fmt: skip


def test_the_references_recorded_orders_give_the_formulas_bubble():
    """``bubble`` is compared exactly against [1, 2 P (P - 1), 2 (M + P - 1)]: a pass is the
    recorded orders' count; the warm-up bug's order (right values) fails on it alone."""
    runner = Runner("pipeline_1f1b")
    for kind, p, m in [("1f1b", 2, 3), ("1f1b", 3, 1), ("gpipe", 3, 2), ("1f1b", 4, 6)]:
        assert runner.run_case(_case(kind, p, m)) < 1, (kind, p, m)
    with pytest.raises(Mismatch) as info:
        Runner("pipeline_1f1b", "warmup_p").run_case(_case("1f1b", 3, 4))
    assert set(info.value.outputs) == {"bubble"}, info.value.report


def test_torch_pipelining_runs_both_schedules_and_refuses_1f1b_below_p():
    runner = Runner("pipeline_1f1b", "torch_pipeline")
    for kind, p, m, dtype in [
        ("gpipe", 3, 1, "float32"),
        ("1f1b", 2, 3, "bfloat16"),
        ("1f1b", 3, 3, "float32"),
    ]:
        assert runner.run_case(_case(kind, p, m, dtype)) < 1, (kind, p, m)
    with pytest.raises(Unsupported, match=r"Schedule1F1B needs M >= P \(M=2, P=3\)") as refused:
        runner.run_case(_case("1f1b", 3, 2))
    assert refused.value.reason == "1F1B with M < P"  # counted by its reason, told by its message
