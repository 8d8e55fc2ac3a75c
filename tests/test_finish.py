"""A shrink cut by a campaign's deadline is finished at the end of the campaign (shardfuzz.engine.finish)."""

import argparse
import copy
import dataclasses
import io
import itertools
import json
import os
import time

import pytest

import shardfuzz
from shardfuzz import InvalidArgument, RunConfig, Runner
from shardfuzz.engine import finish
from shardfuzz.engine.failures import FailureRecorder, load
from shardfuzz.engine.finish import finish_budget, kept_features, simplest_case, try_one_rank
from shardfuzz.engine.hooks import Deadline
from shardfuzz.errors import Finding, LayoutMismatch
from shardfuzz.frontends import campaign
from shardfuzz.frontends.cli_args import _finish_time
from shardfuzz.signature import finding_signature

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


def test_a_finished_shrink_then_found_on_1_rank_says_what_the_1_rank_finding_needs(tmp_path, monkeypatch):
    """The summary's case was on 1 rank ("fails on 1 rank too") and the line under it said "this
    finding ... needs world size 2": the finished shrink's account of the finding the 1-rank try
    replaced (a new user's MoE campaign)."""
    monkeypatch.setattr(campaign, "Deadline", DeadlineAtFirstFinding)
    config = RunConfig(deadline=120, finish_shrink=60, world_sizes=(1, 2), failures_dir=str(tmp_path))
    out = campaign.fuzz_one(TOY, f"{CAUSES}::wrong_from_three_rows", config, stream=io.StringIO())
    [(finding, _)] = out.findings
    [done] = out.finished
    assert finding.case.world_size == 1 and done.finding is finding, (finding.case, done.describe())
    assert "world size" not in done.describe(), done.describe()  # 1 rank is the simplest world
    assert "n 3" in done.describe(), done.describe()  # what it needs: 3 rows


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


def _finding(tmp_path):
    """A real finding of the toy (rank 1's ``x2`` is off), from a run that writes no file."""
    result = shardfuzz.run(
        TOY, f"{CAUSES}::wrong_on_rank1", world_sizes=(2,), profile="shardfuzz-ci", database=None,
        failures_dir=str(tmp_path / "unused"),
    )  # fmt: skip
    assert result.found, result.report
    return result.failures[0]


def test_a_settled_finding_s_file_holds_the_case_it_is_reported_with(tmp_path):
    """The key's last write during a run may be another case (a hang's file held a larger case than
    its report): when the run settles, the file holds the finding's own case, and only then is it
    written again."""
    finding = _finding(tmp_path)
    larger = copy.copy(finding)
    larger.case = dataclasses.replace(finding.case, seed=finding.case.seed + 7)
    larger.context = dataclasses.replace(finding.context, case=larger.case)
    recorder = FailureRecorder(str(tmp_path / "failures"))
    recorder.on_finding(larger.context, larger)  # the last write of the key: another case
    path = recorder.settle(finding, distinct=True)
    record = json.loads(open(path).read())
    assert record["case_repr"] == repr(finding.case) and record["updates"] == 1, record["case_repr"]
    assert recorder.settle(finding, distinct=True) != path  # a second distinct finding: its own file
    recorder.begin_run(1)
    assert recorder.settle(finding, distinct=True) == path
    assert json.loads(open(path).read())["updates"] == 1  # it held it already: not written again


def test_a_finished_shrink_rewrites_a_later_runs_file_in_place_and_a_repeat_is_kept_once(tmp_path):
    """A campaign's second distinct finding of a kind lives in ``-2`` (moved there when its run
    settled); a finished shrink writes over that file, never beside it, and a finding that a
    finished shrink brought to another finding's signature is kept once, its file removed."""
    finding = _finding(tmp_path)
    folder = tmp_path / "failures"
    recorder = FailureRecorder(str(folder))
    recorder.on_finding(finding.context, finding)  # run 1's finding
    recorder.begin_run(2)
    recorder.on_finding(finding.context, finding)  # run 2's, distinct when it was found
    first = recorder.path_for(finding.context, finding.kind).replace(".run2.json", ".json")
    second = recorder.settle(finding, distinct=True)
    assert second is not None and second.endswith("-2.json"), second
    recorder.write(second, finding.context, finding)  # what finish_shrink's rewrite does
    names = sorted(p.name for p in folder.glob("*.json"))
    assert names == sorted(os.path.basename(p) for p in (first, second)), names  # no "-2-2"
    assert json.loads(open(second).read())["updates"] == 1  # written over, once
    taken = json.loads(open(second).read())
    with open(second, "w") as f:  # another campaign's writer took the file over meanwhile
        json.dump({**taken, "writer": "elsewhere:1:abc"}, f)
    recorder.write(second, finding.context, finding)  # never raised into the shrink: noted instead
    assert "is not a file this writer holds" in recorder.errors[second]
    assert json.loads(open(second).read())["writer"] == "elsewhere:1:abc"  # left as it was
    with open(second, "w") as f:
        json.dump(taken, f)
    out = campaign.Outcome("toy", runner=None, findings=[(finding, first), (finding, second)])
    campaign._drop_repeats(out, recorder)
    assert out.findings == [(finding, first)] and out.rediscovered == 1
    assert [p.name for p in folder.glob("*.json")] == [os.path.basename(first)]
    assert list(recorder.written) == [first]


def test_a_dropped_repeat_takes_its_fleet_note_along_and_a_case_shrunk_after_the_offer_says_so(tmp_path):
    """The fleet's notes stay beside their own findings when a repeat is dropped (each later finding
    was shown with the id and note of the one before it: a finding the fleet stored never appeared
    in the summary, another's id did twice). A finding shrunk further after it was offered (a cut
    shrink finished, a 1-rank try) names the case the fleet holds."""
    mismatch = _finding(tmp_path)
    crash = shardfuzz.run(
        TOY, "crash_rank1", world_sizes=(2,), profile="shardfuzz-ci", database=None,
        failures_dir=str(tmp_path / "unused"),
    ).failures[0]  # fmt: skip
    notes = [
        {"id": fid, "fleet": "new", "found_by": "w-1", "found_at": "now", "offered_case": repr(f.case)}
        for fid, f in (("a", mismatch), ("b", mismatch), ("c", crash))
    ]
    out = campaign.Outcome(
        "toy", runner=None, findings=[(mismatch, None), (mismatch, None), (crash, None)], fleet=notes
    )
    campaign._drop_repeats(out, None)
    assert out.findings == [(mismatch, None), (crash, None)] and out.rediscovered == 1
    assert [n["id"] for n in out.fleet] == ["a", "c"]
    entry = {"kind": "mismatch", "case": "Case(small)", "file": None, "site": None, "margin": 2.0}
    lines = "\n".join(campaign._finding_lines({**entry, **notes[0], "offered_case": "Case(large)"}))
    assert "fleet finding a: new" in lines
    assert "offered to the fleet before it was shrunk further here, as Case(large)" in lines
    same = "\n".join(campaign._finding_lines({**entry, **notes[0], "offered_case": "Case(small)"}))
    assert "offered to the fleet" not in same


def test_a_finding_whose_implementation_refuses_one_rank_has_no_one_rank_case(tmp_path):
    """The 1-rank try of a finding whose implementation refuses 1 rank as unsupported replays to no
    case Hypothesis may run: Hypothesis' ``Unsatisfiable``, which ended the campaign in a traceback
    (reached too when a SIGTERM to the process group made every replayed example an external
    fault). It is "no 1-rank case": the finding stays as found."""
    impl = f"{CAUSES}::wrong_on_rank1_never_alone"
    result = shardfuzz.run(
        TOY, impl, world_sizes=(1, 2), profile="shardfuzz-ci", database=None,
        failures_dir=str(tmp_path / "unused"),
    )  # fmt: skip
    assert result.found and result.case.world_size == 2, result.report
    assert try_one_rank(Runner(TOY, impl), result.failures[0], 30.0) is None


def test_a_1_rank_try_replays_its_finding_only_never_the_example_database(tmp_path, monkeypatch):
    """``database=None`` given to ``settings_for`` was dropped as "not set": a 1-rank try (and a
    finished shrink) replayed the profile's example database (``.hypothesis`` in the current
    folder, under a key every target shares), met another failure of the same kind on 2 ranks
    there, and wrote it over the file of the finding it did not replace (a new user's two-bug
    ZeRO-3 target: the summary's case was in no file). It runs with no database but its seed, and
    its file keeps only failures on 1 rank."""
    from shardfuzz.engine.search import search

    impl = f"{CAUSES}::wrong_from_three_rows"
    runner = Runner(TOY, impl, RunConfig(profile="shardfuzz-dev", world_sizes=(1, 2)))
    found = search(
        Runner(TOY, impl, RunConfig(profile="shardfuzz-ci", world_sizes=(1, 2))), None, database=None
    )
    finding = found.failures[0]
    assert finding.case.world_size == 2 and finding.case.sizes["n"] == 3, finding.case
    used = []
    real = finish.given_test
    monkeypatch.setattr(
        finish, "given_test", lambda r, fn, s, *a: used.append(s.database) or real(r, fn, s, *a)
    )
    ran = []
    real_run = Runner.run_case
    monkeypatch.setattr(Runner, "run_case", lambda self, case: ran.append(case) or real_run(self, case))
    one = try_one_rank(runner, finding, 30.0)
    assert used == [None]  # the dev profile has a database; the try reads none of it
    assert one is not None and one.case.world_size == 1, one
    assert ran[0].world_size == 1 and ran[0].sizes == finding.case.sizes, ran  # the finding, on 1 rank
    # the file of a finding keeps only what the try returns: failures on 1 rank
    recorder = FailureRecorder(str(tmp_path / "failures"))
    recorder.on_finding(finding.context, finding)
    (path,) = recorder.written
    hook = finish._Rewrite(recorder, path, lambda f: True, finding_signature(finding))
    hook.on_finding(finding.context, finding)
    assert load(path, trust_refs=True)["case"] == finding.case
    hook = finish._Rewrite(recorder, path, lambda f: f.case.world_size == 1, finding_signature(finding))
    hook.on_finding(finding.context, finding)  # on 2 ranks: not taken
    assert load(path, trust_refs=True)["case"] == finding.case
    # on 1 rank its wrong ranks differ: another signature, written once at the end, as a finding
    # whose shrink drifted (hold), never while the try goes on
    assert finding_signature(one) != finding_signature(finding)
    hook.on_finding(one.context, one)
    assert load(path, trust_refs=True)["case"] == finding.case
    assert load(recorder.hold(path, one), trust_refs=True)["case"] == one.case


def test_a_mismatchs_distinct_options_read_as_options_in_the_summary():
    """dtensor_ops' site ends with its distinct option (the op): it read "options on ranks
    [('op', 'aten.cumsum.default')]" in the summary."""
    from shardfuzz.errors import Mismatch

    site = (("y0", (1,)), ("total", ()), ("options", (("op", "aten.cumsum.default"),)))
    text = campaign._site(Mismatch("report", site=site))
    assert text == "y0 on ranks [1], total assembled over the ranks, op=aten.cumsum.default", text


def test_a_layout_finding_names_its_first_problem_in_the_summary(proof):
    """A new user's MoE: ``- layout: Case(...)`` named no output, where a mismatch's line names its
    outputs and ranks. A real layout finding (tp_mlp's floor split drops the remainder)."""
    (path,) = proof("tp_mlp", "floor_split").glob("*.json")
    case = load(str(path), trust_refs=True)["case"]
    with pytest.raises(LayoutMismatch) as excinfo:
        Runner("tp_mlp", "floor_split").run_case(case)
    f = excinfo.value
    assert f.problems and campaign._site(f).startswith(f.problems[0].splitlines()[0][:100]), f.problems
    long = LayoutMismatch("report")
    long.problems = ("x" * 500, "second", "third")
    assert campaign._site(long) == "x" * 157 + "... (and 2 more)"


def test_a_runner_with_other_hooks_names_the_implementation_as_its_user_did():
    """The runner that finishes a shrink writes the implementation's name as the campaign's runner
    does (it wrote the file path before: ``impl`` and the rerun line changed under the user)."""
    runner = Runner(TOY, "wrong_rank1")
    again = runner.with_hooks([])
    assert (again.impl_name, again.impl_ref, again.config) == ("wrong_rank1", runner.impl_ref, runner.config)


def test_the_summary_names_why_cases_were_rejected_as_unsupported_or_excluded():
    """The reasons a campaign's cases were rejected as unsupported (docs/reference/target-spec.md:
    "counted by reason in the summary"), the most frequent first, and how many more."""
    row = {
        "target": "t", "impl": "i", "examples": 10, "per_second": 1.0, "runs": 1, "found": False, "interrupted": False,
        "unsupported": 7, "unsupported_reasons": {"rule": 5, "smoothing": 1},
        "excluded": 3, "excluded_reasons": {"options['smoothing'] > 0": 3},
    }  # fmt: skip
    text = campaign.summary_table([row])
    assert "(7 more cases drawn, rejected as unsupported)" in text, text  # not among the 10 examples
    assert "rejected as unsupported: rule x5; smoothing x1; and 1 more case, for reasons not shown" in text, (
        text
    )
    one = campaign.summary_table([dict(row, unsupported=1, unsupported_reasons={"rule": 1}, excluded=1)])
    assert "(1 more case drawn, rejected as unsupported)" in one, one
    assert "(1 more case drawn, excluded as known failures)" in one, one
    assert "excluded as known failures: options['smoothing'] > 0 x3" in text, text
    # a closest pass whose case gave a finding when judged again (it passed the first time)
    flaky = {
        **row,
        "closest_pass": 0.9,
        "closest_pass_upper_bound": True,
        "closest_pass_rerun_failed": "mismatch",
    }
    text = campaign.summary_table([flaky])
    assert "its case gave a mismatch when run again: not deterministic?" in text, text
    # the closest pass's case is named, but not where every compared element was equal: any case is
    # as close (a new user's exact resharding target named one and looked for what was special)
    named = campaign.summary_table([dict(row, closest_pass=0.3, closest_pass_case="Case(x)")])
    assert "closest pass at Case(x)" in named, named
    exact = campaign.summary_table([dict(row, closest_pass=0.0, closest_pass_case="Case(x)")])
    assert "Case(x)" not in exact and "every compared element equal" in exact, exact


def test_a_summary_row_names_every_kind_among_its_distinct_findings():
    """A hang first and a mismatch second read "FOUND hang: 2 distinct findings" (a new user)."""
    row = {
        "target": "t", "impl": "i", "examples": 33, "per_second": 0.2, "runs": 1, "found": True,
        "interrupted": False, "kind": "hang",
        "findings": [{"kind": "hang", "case": "C1", "site": "stuck on ranks [1]"},
                     {"kind": "mismatch", "case": "C2", "site": "y on ranks [0]"}],
    }  # fmt: skip
    text = campaign.summary_table([row])
    assert "FOUND hang, mismatch: 2 distinct findings" in text, text
    one = campaign.summary_table([dict(row, findings=row["findings"][:1])])
    assert "FOUND hang" in one and "mismatch" not in one, one
    # the examples column counts the shrinking: when the search first failed is said apart
    first = campaign.summary_table([dict(row, first_failure_at=7)])
    assert "FOUND hang, mismatch: 2 distinct findings; first failing example: 7 of 33" in first, first


def test_a_summary_names_an_assembled_outputs_mismatch_without_an_empty_rank_list():
    """A Partial output is compared as the sum over ranks: its site has no ranks of its own (the
    summary said 'aux on ranks []')."""
    import types

    finding = types.SimpleNamespace(kind="mismatch", site=(("aux", ()), ("y", (0, 1))))
    assert campaign._site(finding) == "aux assembled over the ranks, y on ranks [0, 1]"
    # in the order the target declares its outputs (the site is sorted by name: the forward output
    # y came after every gradient, a new user said), the distinct options last
    declared = types.SimpleNamespace(
        kind="mismatch",
        site=(("grad_w", (1,)), ("grad_x", (0,)), ("y", (0, 1)), ("options", (("op", "sum"),))),
        outputs={"y": [0, 1], "grad_x": [0], "grad_w": [1]},
    )
    assert campaign._site(declared) == "y on ranks [0, 1], grad_x on ranks [0], grad_w on ranks [1], op=sum"
    # a communication finding's and a hang's ranks are named as ranks ("over budget (0, 1)" read
    # as a pair of numbers to a new user)
    over = types.SimpleNamespace(kind="communication", site=("over budget", (0, 1)))
    assert campaign._site(over) == "over budget on ranks [0, 1]"
    stuck = types.SimpleNamespace(kind="hang", site=("stuck", (1,)))
    assert campaign._site(stuck) == "stuck on ranks [1]"
    with_op = types.SimpleNamespace(kind="hang", site=("stuck", (1,), ("options", (("op", "aten.sum"),))))
    assert campaign._site(with_op) == "stuck on ranks [1], op=aten.sum"  # a target's distinct options


def test_the_closest_pass_is_measured_again_only_when_it_is_an_upper_bound_and_a_dead_rank_leaves_it_unmeasured():
    """``_measure_closest_pass`` (tests/test_cli.py runs it for real): nothing to measure after a
    finding or for a bound judged with the noise; a rank killed from outside during the measure
    leaves the summary's bound as it is, never the campaign's report lost."""
    import types

    from shardfuzz.engine.stats import Stats
    from shardfuzz.errors import ExternalFault

    def outcome(upper_bound, fails=0, raises=None):
        stats = Stats(failures=fails, closest_pass="a case", closest_pass_upper_bound=upper_bound)

        def run_case(case):
            if raises is not None:
                raise raises
            return 0.25

        again = types.SimpleNamespace(run_case=run_case, always_noise=False)
        runner = types.SimpleNamespace(stats=stats, with_hooks=lambda hooks: again)
        out = campaign.Outcome("t", runner=runner)
        campaign._measure_closest_pass(out, runner)
        return out, again

    out, again = outcome(True)
    assert out.closest_measured == 0.25 and again.always_noise
    assert outcome(False)[0].closest_measured is None and outcome(True, fails=1)[0].closest_measured is None
    out, _ = outcome(True, raises=ExternalFault("rank 1 was killed (SIGKILL)"))
    assert out.closest_measured is None and out.closest_rerun_failed is None


def test_an_exclude_is_named_as_reading_an_absent_key_only_when_no_case_had_it():
    from shardfuzz.engine.stats import Stats

    s = Stats()
    s.exclude_lacked.update({("options['sp']", "'sp'"): 4, ("options['sp']", None): 3})  # a branch's option
    s.exclude_lacked.update({("sizes['hiddn'] > 0", "'hiddn'"): 7})  # no case had it
    assert s.exclusions_on_absent_keys() == {"sizes['hiddn'] > 0": ("'hiddn'", 7)}
    s.excluded["sizes['hiddn'] > 0"] += 1  # it excluded something after all
    assert s.exclusions_on_absent_keys() == {}


def test_an_extra_budget_overrun_by_one_finding_leaves_the_next_none_never_less(monkeypatch):
    """A hang's example ran past the extra budget while finishing one cut finding, and the next was
    told "0.0 s of an extra -7.22517 s" (a new user's dp x tp campaign)."""
    given: list[float] = []

    def overrunning(runner, finding, budget, **_):
        given.append(budget)
        seconds = budget + 5.0  # the last example ran on past the budget's end
        return finish.Finished(finding, False, seconds, budget, 2, ["hidden 10"], True, finding.case)

    monkeypatch.setattr(campaign, "finish_shrink", overrunning)
    clock = itertools.chain([0.0, 0.0], itertools.repeat(20.0))  # the first finding took 20 s
    monkeypatch.setattr(campaign.time, "perf_counter", lambda: next(clock))
    cut = [Finding("a hang"), Finding("a rank's error")]
    for f in cut:
        f.cut_short = "deadline"  # type: ignore[attr-defined]
    out = campaign.Outcome("t", runner=None, findings=[(f, None) for f in cut])  # type: ignore[arg-type]
    campaign._finish_cut_shrinks(out, None, RunConfig(deadline=60), None, io.StringIO())
    assert given == [15.0, 0.0], given
    first, second = (d.describe() for d in out.finished)
    assert "20.0 s of an extra 15.0 s" in first and "up to 20 s" in first, first
    assert "no time was left of the extra budget" in second and "-" not in second.split(";")[0], second
    assert "not dropped: hidden 10" in second, second


def test_the_summary_keeps_each_rows_figures_under_their_headings_whatever_the_names():
    """A long implementation name (vocab_parallel's torch_loss_parallel_weight_ignore, 33
    characters) widens its column for every row; it pushed its own row's figures out of line."""
    base = {"examples": 30, "per_second": 12.5, "runs": 1, "found": False, "interrupted": False}
    rows = [
        dict(base, target="vocab_parallel", impl="torch_loss_parallel_weight_ignore"),
        dict(base, target="a_target_named_at_length", impl="reference", job=2),
        dict(base, target="tp_mlp", impl="reference"),
    ]
    head, rule, *body = campaign.summary_table(rows).splitlines()
    assert len(rule) == len(head)
    ends = {head.index("examples") + len("examples"), head.index("ex/s") + len("ex/s")}
    for line in body:
        assert {line.index("30") + 2, line.index("12.5") + 4} == ends, (head, line)
    assert body[1].startswith("a_target_named_at_length reference [job 2] "), body[1]
    # the lines under a row stay under the implementation column
    rows[1]["failure_files"] = ["f.json"]
    under = campaign.summary_table(rows).splitlines()[4]
    assert under.index("failure file:") == head.index("implementation"), (head, under)


def test_ctrl_c_while_a_clean_runs_closest_pass_is_measured_keeps_the_figures_and_says_interrupted(
    monkeypatch,
):
    """The closest pass is measured (and rechecked) after the search: a Ctrl-C or SIGTERM there
    ends the measuring, the run's own figures stand, and the run says it was interrupted."""

    def interrupted(runner):
        raise KeyboardInterrupt

    monkeypatch.setattr(campaign, "measure_closest_pass", interrupted)
    out = campaign.Outcome("t", runner=None)
    campaign._measure_closest_pass(out, None)
    assert out.interrupted and out.closest_measured is None and out.closest_rechecked is None
