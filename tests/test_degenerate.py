"""The degenerate-output check itself: it sees zeros, constants and a one-hot softmax."""

import torch

import shardfuzz.strategies as sst
from shardfuzz import Case, Replicate, Target
from shardfuzz.engine.degenerate import SoftmaxWatch, degenerate_share, is_degenerate
from shardfuzz.spec.inputs import generator, randn


def test_zero_and_constant_outputs_are_degenerate_counters_are_not():
    assert is_degenerate(torch.zeros(3))
    assert is_degenerate(torch.full((2, 2), 0.5))
    assert not is_degenerate(torch.full((3,), 2.0))  # a step counter: exact by design
    assert not is_degenerate(torch.tensor([0.5, 0.25]))
    assert not is_degenerate(torch.tensor([0.5]))  # one element is no pattern


def test_a_one_hot_softmax_is_seen_a_soft_one_is_not():
    for logits, saturated in ((torch.tensor([[60.0, 0.0]]), True), (torch.tensor([[1.0, 0.0]]), False)):
        with SoftmaxWatch() as watch:
            torch.log_softmax(logits.double(), -1)
        assert watch.saturated is saturated


def _softmax_target(scale: float) -> Target:
    return Target(
        name="softmax_toy",
        cases=lambda world_sizes=None: sst.cases("softmax_toy", sizes={"n": sst.Free(2, 4)}),
        inputs=lambda case: {"x": randn(case, case.sizes["n"], gen=generator(case), scale=scale)},
        oracle=lambda inp, case: {"p": torch.softmax(inp["x"], 0)},
        outputs={"p": Replicate()},
        implementations={"reference": lambda ctx: None},
    )


def test_a_target_with_saturating_inputs_is_flagged():
    cases = [Case(target="softmax_toy", world_size=1, mesh=(1,), sizes={"n": 3}, seed=s) for s in range(20)]
    assert degenerate_share(_softmax_target(1000.0), cases).share > 0.9
    assert degenerate_share(_softmax_target(1.0), cases).share == 0.0


def test_the_share_of_a_strategy_rather_than_its_cases_is_a_clear_error():
    # a new user passed target.strategy(): "'LazyStrategy' object is not iterable"
    import pytest

    from shardfuzz.engine.degenerate import degenerate_share
    from shardfuzz.errors import InvalidArgument
    from shardfuzz.spec.registry import get_target

    target = get_target("tp_mlp")
    with pytest.raises(InvalidArgument, match=r"cases must be Case objects, e\.g\. a list drawn"):
        degenerate_share(target, target.strategy())


def test_inputs_are_compared_whole_whatever_they_hold():
    """A target's inputs may hold lists of tensors or numpy arrays: comparing them raised, and a
    clean run's summary became "the fuzzer itself failed" (a review found it)."""
    import numpy as np

    from shardfuzz.engine.degenerate import same_values

    a = {"xs": [torch.ones(2), torch.zeros(1)], "table": np.arange(3), "k": 2}
    b = {"xs": [torch.ones(2), torch.zeros(1)], "table": np.arange(3), "k": 2}
    assert not same_values(a, b)  # an array's == gives no one answer: never called the same
    assert same_values({"xs": [torch.ones(2)], "k": {"n": 1}}, {"xs": [torch.ones(2)], "k": {"n": 1}})
    assert not same_values({"xs": [torch.ones(2)]}, {"xs": [torch.zeros(2)]})
