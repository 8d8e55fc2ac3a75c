"""The edge value profile's guard: a case whose edge value leaves the finite range in the oracle
itself is not a case (a correct implementation cannot carry it either): refused and counted, never
judged, and the ranks that ran it stay warm."""

import os

import pytest
import torch

import shardfuzz
from shardfuzz import Case
from shardfuzz.engine import runner as runner_module
from shardfuzz.engine.config import RunConfig
from shardfuzz.errors import Unsupported
from shardfuzz.spec.registry import get_target
from shardfuzz.verdict.oracle import evaluate_oracle

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = f"{os.path.join(HERE, 'data', 'edge_target.py')}::EDGE_EXP_SUM"


def _case(kind, dtype="float32"):
    options = {"edge": kind, "edge_exp": 0, "edge_slot": 0}
    return Case(
        target="edge_exp_sum",
        world_size=2,
        mesh=(2,),
        sizes={"n": 4},
        split=("n",),
        dtype=dtype,
        profile="edge",
        options=options,
    )


def test_an_edge_case_that_overflows_the_oracle_is_refused_with_its_reason():
    target = get_target(TARGET)
    with pytest.raises(Unsupported, match="output 'total' of the oracle is not finite with edge='max'") as e:
        evaluate_oracle(target, _case("max"))  # exp(65504) overflows float64
    assert e.value.reason == "edge value overflows the oracle"
    expected = evaluate_oracle(target, _case("subnormal"))
    assert bool(torch.isfinite(expected.ref["total"]).all())


def test_the_same_overflow_without_the_edge_profile_is_judged_as_before():
    plain = Case(target="edge_exp_sum", world_size=2, mesh=(2,), sizes={"n": 4}, split=("n",))
    evaluate_oracle(get_target(TARGET), plain)  # no gate outside the edge profile: nothing raised


def test_a_run_counts_the_refused_edge_cases_and_keeps_its_ranks(monkeypatch):
    discarded = []
    real = runner_module.discard_pool
    monkeypatch.setattr(
        runner_module, "discard_pool", lambda pool, **kw: (discarded.append(pool), real(pool, **kw))
    )
    result = shardfuzz.run(TARGET, profile="shardfuzz-ci", database=None, max_examples=30, world_sizes=(2,))
    assert not result.found, result.report
    refused = result.stats.unsupported.get("edge value overflows the oracle", 0)
    assert refused > 0 and result.stats.passed >= 30, result.stats.summary()
    assert discarded == []  # the ranks finished the refused cases and stayed warm


def test_a_non_finite_output_of_the_target_itself_is_judged_not_blamed_on_the_edge_value():
    # vocab_ce's loss is 0 / 0 when every label is ignored (as with F.cross_entropy): NaN with or
    # without the edge value, so the case is judged like any other; its grad stays finite
    target = get_target(os.path.join(HERE, "..", "examples", "vocab_ce.py"))
    ignored = None
    for seed in range(200):  # one token, its label ignored (30% of the draws)
        case = Case(
            target="vocab_ce", world_size=2, mesh=(2,), sizes={"tokens": 1, "vocab": 4}, split=("vocab",),
            profile="edge", seed=seed, options={"ignore_index": -100, "edge": "max", "edge_exp": 0, "edge_slot": 1},
        )  # fmt: skip
        if bool((target.inputs(case)["labels"] == -100).all()):
            ignored = case
            break
    assert ignored is not None
    expected = evaluate_oracle(target, ignored)  # not refused
    assert bool(expected.ref["loss"].isnan()) and bool(torch.isfinite(expected.ref["grad_logits"]).all())
    runner = runner_module.Runner(target, None, RunConfig())
    assert runner.run_case(ignored) <= 1  # the ranks' NaN loss matches the oracle's; judged, passed
    assert runner.stats.unsupported == {}


def test_the_check_without_the_edge_value_leaves_the_random_state_as_it_found_it():
    from shardfuzz.verdict import oracle as oracle_module

    target = get_target(os.path.join(HERE, "..", "examples", "vocab_ce.py"))
    case = Case(
        target="vocab_ce", world_size=2, mesh=(2,), sizes={"tokens": 2, "vocab": 4}, split=("vocab",),
        profile="edge", seed=3, options={"ignore_index": -100, "edge": "max", "edge_exp": 0, "edge_slot": 1},
    )  # fmt: skip
    import random

    import numpy as np

    from shardfuzz.spec.inputs import RandomState

    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    before = RandomState.now()
    oracle_module._oracle64_without_edge(target, case, RandomState.now())
    assert torch.equal(torch.get_rng_state(), before.torch_state)
    assert random.getstate() == before.python and (np.random.get_state()[1] == before.numpy[1]).all()
