"""A shrink cut by a campaign's deadline is finished at the end of the campaign (shardfuzz.engine.finish)."""

import argparse
import io
import json
import os
import time

import pytest

from shardfuzz import InvalidArgument, RunConfig
from shardfuzz.engine.failures import FailureRecorder, load
from shardfuzz.engine.finish import finish_budget, kept_features, simplest_case
from shardfuzz.engine.hooks import Deadline
from shardfuzz.frontends import campaign
from shardfuzz.frontends.cli_args import _finish_time

HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "data", "toy_target.py")
CAUSES = os.path.join(HERE, "data", "cause_impls.py")


class DeadlineAtFirstFinding(Deadline):
    """The campaign's deadline, falling at the first failing example: Hypothesis' shrink is cut
    before its first step on any machine, however long the pools take to start."""

    def on_finding(self, context, finding):
        self.at = min(self.at, time.perf_counter())


def test_a_shrink_cut_by_the_deadline_is_finished_within_the_extra_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "Deadline", DeadlineAtFirstFinding)
    config = RunConfig(deadline=120, finish_shrink=60, world_sizes=(2,), failures_dir=str(tmp_path))
    recorder = FailureRecorder(str(tmp_path))
    out = campaign.fuzz_one(TOY, f"{CAUSES}::slow_wrong", config, recorder=recorder, stream=io.StringIO())
    assert out.elapsed < 100  # the deadline fell in the shrink, not at 120 s
    [done] = out.finished
    assert done.cut_case is not None and done.cut_case != done.finding.case
    assert done.complete and done.reproduced, done.describe()
    case = done.finding.case
    assert (case.world_size, case.sizes["n"], case.seed) == (2, 2, 0), case  # fully shrunk
    assert done.kept == []  # on 2 ranks, n 2 is the toy's simplest size
    assert "seed" in " ".join(kept_features(done.cut_case, simplest_case(out.runner)))
    [(finding, path)] = out.findings
    assert finding is done.finding and "shrinking finished at the end of the campaign" in finding.report
    with open(path) as f:
        assert json.load(f)["case"] == case.to_dict()  # the failure file holds the finished case
    assert load(path, trust_refs=True)["case"] == case  # within the toy's bounds (docs/trust.md)
    row = out.row()
    assert not row["cut_short"] and "shrinking finished" in row["finished"][0]
    assert "then finished" in campaign.summary_table([row])


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, False, "30s"])
def test_a_bad_extra_budget_is_refused_naming_it(value):
    with pytest.raises(InvalidArgument, match="finish_shrink="):
        RunConfig(finish_shrink=value)


def test_the_extra_budget_is_stated_and_bounded():
    assert finish_budget(RunConfig(deadline=60)) == 15.0  # a quarter of the duration
    assert finish_budget(RunConfig(deadline=3600)) == 120.0  # at most 2 minutes
    assert finish_budget(RunConfig(deadline=60, finish_shrink=0)) == 0.0
    assert finish_budget(RunConfig()) == 0.0  # no deadline, nothing cut by one
    with pytest.raises(argparse.ArgumentTypeError, match="--finish-shrink='soon'"):
        _finish_time("soon")
    assert _finish_time("0") == 0.0 and _finish_time("2m") == 120.0
