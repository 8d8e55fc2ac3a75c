"""Fuzzing campaigns from the command line: live progress, time budgets, Ctrl-C, parallel jobs.

A campaign is a sequence of ordinary Hypothesis runs (never a search loop of ours): with a
deadline, runs with fresh seeds follow each other until the time is spent; the last one is
stopped at the deadline (a :class:`~shardfuzz.engine.hooks.Deadline` hook), and an example still running
the grace period after it is abandoned, so ``--duration D`` ends by D plus the grace whatever the
example timeouts are. A campaign keeps going after a finding: each run's shrunk findings are
compared by signature (kind and cause: an exception's cause frame past torch's and shardfuzz's
framework frames and its normalised message, the wrong outputs and ranks at the minimal case;
:mod:`shardfuzz.signature`), so what Hypothesis shrinks is never changed, and
every *distinct* finding is reported and kept in a failure file of its own; one seen again is
counted as a rediscovery. Known failures are set aside with ``--exclude`` / ``known_failures``. A
deadline or Ctrl-C while a finding is being shrunk reports the smallest case found so far; after a
deadline, such a finding is shrunk further within an extra budget (:mod:`shardfuzz.engine.finish`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import math
import os
import sys
import tempfile
import time
from typing import Any, TextIO

from shardfuzz.engine.config import RunConfig
from shardfuzz.engine.degenerate import inert_profiles
from shardfuzz.engine.failures import FailureRecorder
from shardfuzz.engine.finish import (
    ONE_RANK_S,
    Finished,
    finish_budget,
    finish_shrink,
    kept_features,
    simplest_case,
    try_one_rank,
)
from shardfuzz.engine.fleet import signature_of
from shardfuzz.engine.fleet_worker import FleetWorker, NoFleet
from shardfuzz.engine.hooks import Deadline, RunHooks, StickyInterrupt, TimeUp
from shardfuzz.engine.runner import Runner, Stats
from shardfuzz.engine.search import Result, search, settings_for, stable_identity
from shardfuzz.engine.shared_db import save_only
from shardfuzz.errors import Finding, InfrastructureError, InvalidArgument
from shardfuzz.frontends.display import Progress, display_for
from shardfuzz.ranks.pool_cache import shutdown as stop_pools
from shardfuzz.report import plot
from shardfuzz.report.closest_pass import (
    closest_pass_case,
    closest_pass_words,
    margin_text,
    margin_why,
    measure_closest_pass,
    recheck_closest_pass,
)
from shardfuzz.report.findings import ONE_RANK_SHORT
from shardfuzz.signature import finding_signature
from shardfuzz.spec.budget import budget_for
from shardfuzz.verdict.decide import BEYOND_RANGE
from shardfuzz.verdict.oracle import EDGE_OVERFLOWS, ORACLE_OVERFLOWS


@dataclasses.dataclass
class Outcome:
    label: str
    runner: Runner
    result: Result | None = None
    runs: int = 0
    elapsed: float = 0.0
    interrupted: bool = False
    #: the fuzzer itself failed after the campaign had findings (a torchrun node lost for good):
    #: its message; the findings are reported and decide the exit code
    failed: str | None = None
    #: an example still running the grace period after the deadline was abandoned
    overran: bool = False
    failure_files: list[str] = dataclasses.field(default_factory=list)
    #: every distinct finding, in the order found, with its failure file (None: not written)
    findings: list[tuple[Finding, str | None]] = dataclasses.field(default_factory=list)
    #: findings of later runs whose signature was seen before
    rediscovered: int = 0
    #: with a fleet (``--database redis://...``): what the fleet says of each of ``findings``, index
    #: for index (``offered_case``: the case it was offered, before a later shrink here)
    fleet: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: the findings whose shrink the deadline cut, shrunk further after it
    finished: list[Finished] = dataclasses.field(default_factory=list)
    #: a clean run whose closest pass is an upper bound: that case judged again with the noise
    #: term (its true error/tolerance), or None
    closest_measured: float | None = None
    #: the kind of finding that case gave when judged again (it passed the first time), or None
    closest_rerun_failed: str | None = None
    #: the leading figure's case judged again with a failure's recheck (recheck_closest_pass)
    closest_rechecked: float | None = None
    #: the trigger conditions the progress shows
    shown: tuple[str, ...] = ()
    #: the share of the strategy's draws that meets each of ``shown``
    drawn_shares: dict[str, float] = dataclasses.field(default_factory=dict)
    #: (seconds, examples, failing) as the campaign went (:class:`Timeline`)
    timeline: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)

    def row(self, pictures: bool = False) -> dict[str, Any]:
        """The summary row (``--summary-json``); with ``pictures``, what the HTML report shows too:
        each finding's report and a mismatch's plot, the trigger counts and the timeline."""
        s = self.runner.stats
        row = self._row(s)
        if pictures:
            row["triggers"] = {t: s.triggers.get(t, 0) for t in self.shown}
            row["timeline"] = [list(p) for p in self.timeline]
            for entry, (f, _) in zip(row["findings"], self.findings):
                entry["report"] = f.report
                entry.update(_plot_of(f))
        return row

    def _row(self, s: Stats) -> dict[str, Any]:
        return {
            "target": self.runner.target.name,
            "impl": self.runner.impl_name,
            "examples": s.examples,
            "per_second": s.examples / self.elapsed if self.elapsed else 0.0,
            "found": bool(self.result and self.result.found),
            "kind": self.result.kind if self.result and self.result.found else None,
            "case": repr(self.result.case) if self.result and self.result.found else None,
            "runs": self.runs,
            # the examples column counts shrinking too: when the search first failed
            "first_failure_at": s.first_failure_at,
            "seconds": self.elapsed,
            "failure_files": self.failure_files,
            "interrupted": self.interrupted,
            # the fuzzer itself failed after this campaign's findings (a --jobs parent says it)
            "failed": self.failed,
            "cut_short": bool(self.result and self.result.shrink_cut_short)
            or any(getattr(f, "cut_short", None) for f, _ in self.findings),
            "finished": [f.describe() for f in self.finished],
            "overran": self.overran,
            "unsupported": sum(s.unsupported.values()),
            "unsupported_reasons": dict(s.unsupported.most_common(LEAKS_SHOWN)),
            # the command that reruns the first case refused for each reason shown
            "unsupported_first": {
                k: s.first_refused[k]
                for k, _ in s.unsupported.most_common(LEAKS_SHOWN)
                if k in s.first_refused
            },
            # a clean run's blind spots: conditions its target reaches that no example met (a
            # new user's run that refused half its cases never met its own trigger, unsaid)
            "never_reached": [t for t in self.shown if not s.triggers.get(t)] if s.examples else [],
            # conditions the pinned options (--option) put out of reach, left off the progress line
            "out_of_reach_of_pins": list(self.runner.out_of_reach_of_pins()),
            # conditions the search met far less often than the strategy draws them (a new user's
            # 1,500 examples met bfloat16 in 6%, unsaid: Hypothesis dwelt near its closest pass)
            "rarely_reached": rarely_reached(s, self.drawn_shares),
            # said of a run that drew only 16-bit cases: no float32 case judged those outputs at
            # float32's bound (a new user's bfloat16-only run passed a per-shard RMS bug there)
            "wider_outputs": (
                dict(s.wider_outputs) if s.wider_outputs and s.pass_dtypes <= LOW_PRECISION else {}
            ),
            # and that it drew no other: a bug under one rounding of its outputs cannot show (a new
            # user's ZeRO step clipped to a 1e-3 update: 496x in float32 cases, clean in 1,690 bf16)
            "only_dtypes": sorted(s.pass_dtypes) if s.pass_dtypes and s.pass_dtypes <= LOW_PRECISION else [],
            # passing examples whose outputs were all zero or constant: nothing compared there
            "degenerate": degenerate_record(s),
            # outputs whose allowed error was as wide as the output in many passes: checked little
            "wide_bounds": wide_bound_record(s),
            # value profiles that changed no input: their passes repeated normal-profile cases
            "inert_profiles": inert_profiles(self.runner.target, s.profile_samples, s.profile_passes)
            if not (self.result and self.result.found)
            else {},
            # a target with budgets for other implementations: this one's bytes went unchecked
            "budgets_elsewhere": (
                sorted(self.runner.target.comm)
                if self.runner.target.comm and budget_for(self.runner.target, self.runner.impl_name) is None
                else []
            ),
            "excluded": sum(s.excluded.values()),
            # every expression the run was given, each with its count (0 too: the docs promise each)
            "excluded_reasons": {
                **dict(s.excluded.most_common()),
                **{e: 0 for e in self.runner.config.exclude if e not in s.excluded},
            },
            "exclude_missing": {text: list(v) for text, v in s.exclusions_on_absent_keys().items()},
            "closest_pass": s.worst_pass_ratio,
            # the case of the figure the words lead with (the bound's, or a pass measured higher)
            "closest_pass_case": (
                repr(
                    closest_pass_case(
                        s.closest_pass,
                        s.closest_pass_upper_bound,
                        self.closest_measured,
                        s.measured_pass_ratio,
                        s.measured_pass_case,
                    )
                )
                if s.closest_pass is not None
                else None
            ),
            "closest_pass_upper_bound": s.closest_pass_upper_bound,
            "closest_pass_measured": self.closest_measured,
            "measured_pass_ratio": s.measured_pass_ratio,
            "closest_pass_rerun_failed": self.closest_rerun_failed,
            "closest_pass_rechecked": self.closest_rechecked,
            "external_faults": s.external_faults,
            "leaks": dict(s.leaks.most_common(LEAKS_SHOWN)),
            "leaks_total": sum(s.leaks.values()),
            "rediscovered": self.rediscovered,
            "findings": [
                {
                    "kind": f.kind,
                    "margin": f.ratio,
                    "margin_why": margin_why(getattr(f, "diffs", None), f.ratio),
                    # its failing examples' largest margin, where it dwarfs the shrunk case's
                    "widest": _widest(s, f),
                    "case": repr(f.case),
                    "file": path,
                    "site": _site(f),
                    "one_rank": f.notes_one_rank and getattr(f.case, "world_size", 0) == 1,
                    # a later run's finding cut by Ctrl-C read as a distinct, minimal one
                    "cut_short": getattr(f, "cut_short", None),
                }
                | (self.fleet[i] if i < len(self.fleet) else {})
                for i, (f, path) in enumerate(self.findings)
            ],
        }


#: a finding's widest margin is said beside its shrunk case's from this many times it
WIDEST_SAID = 10.0


def _widest(s: Stats, f: Finding) -> float | None:
    """The largest margin of ``f``'s failing examples (its signature's) where it is at least
    :data:`WIDEST_SAID` times the shrunk case's (a thin margin read as noise), else None."""
    if f.kind != "mismatch" or f.ratio is None or not math.isfinite(f.ratio):
        return None
    widest = s.widest.get(finding_signature(f))
    return widest if widest is not None and widest >= WIDEST_SAID * f.ratio else None


def _plot_of(f: Finding) -> dict[str, Any]:
    """A mismatch's plot as base64 PNG (``plot``), or why there is none (``plot_missing``)."""
    diffs = getattr(f, "diffs", None)
    if f.kind != "mismatch" or not diffs:
        return {}
    try:
        plot.require_matplotlib("--report")
    except InvalidArgument as e:  # the [plot] extra is optional: the page says how to get it
        return {"plot_missing": str(e)}
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plot.png")
            plot.plot_mismatch(diffs, path)
            with open(path, "rb") as fh:
                return {"plot": base64.b64encode(fh.read()).decode("ascii")}
    except Exception as e:  # noqa: BLE001 (a picture of a finding already reported: whatever breaks in matplotlib, the summary and the page are still written)
        return {"plot_missing": f"the plot failed: {type(e).__name__}: {e}"}


class Timeline(RunHooks):
    """Samples (seconds, examples, failing) of a campaign, at most one every :data:`EVERY_S`, for
    its report's throughput chart; thinned to every other sample past :data:`MOST` of them."""

    EVERY_S, MOST = 0.5, 2000

    def __init__(self, t0: float) -> None:
        self.t0, self.last = t0, -1.0
        self.samples: list[tuple[float, int, int]] = []

    def before_example(self, runner: Runner, case: Any) -> None:  # noqa: ARG002 (the hook's signature)
        now = time.perf_counter() - self.t0
        if now - self.last >= self.EVERY_S:
            self.last = now
            self.samples.append((now, runner.stats.examples, runner.stats.failures))
            if len(self.samples) > self.MOST:
                del self.samples[1::2]


def _site(f: Finding) -> str:
    """A finding's site in words, for the summary (the wrong outputs and ranks, the exception...)."""
    if f.kind == "mismatch":
        # in the target's order of its outputs, as the report lists them (the site is sorted by
        # name: "grad_wk, ..., grad_x, y" hid whether the forward was wrong, a new user said)
        declared = {name: i for i, name in enumerate(getattr(f, "outputs", None) or {})}
        site = sorted(f.site, key=lambda entry: declared.get(entry[0], len(declared)))
        # an output compared assembled (Partial: the sum over ranks) is wrong on no rank of its own;
        # a target's distinct options (dtensor_ops' op) close the site: "op=aten.cumsum.default"
        return ", ".join(
            ", ".join(f"{k}={v}" for k, v in ranks)
            if name == "options"
            else f"{name} on ranks {list(ranks)}"
            if ranks
            else f"{name} assembled over the ranks"
            for name, ranks in site
        )
    problems = getattr(f, "problems", ())
    if f.kind == "layout" and problems:  # "- layout: Case(...)" named no output (a new user's audit)
        first = problems[0].splitlines()[0]
        first = first if len(first) <= LINE_LIMIT else first[: LINE_LIMIT - 3] + "..."
        return first + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    if f.kind == "rank-error" and len(f.site) == 3:  # the cause: shardfuzz.signature.Cause
        # the message in its own words, from the report: the site's has every number as N, and a
        # new user read "required CUDA N+ and NCCL N+" as torch's text
        said = (ln.strip() for ln in f.report.splitlines())
        raw = next((ln for ln in said if ln.startswith(f"{f.site[0]}: ")), None)
        message = raw.split(": ", 1)[1] if raw else f.site[2]
        message = message if len(message) <= LINE_LIMIT else message[: LINE_LIMIT - 3] + "..."
        return f"{f.site[0]} in {f.site[1]}: {message}"
    if f.kind == "rank-error" and f.site and str(f.site[0]).startswith("exit code"):
        # a rank that died: the C++ error it printed, where the report's head has one
        head = f.report.split("\n", 1)[0]
        printed = head.split("): ", 1)[1] if "died (exit code" in head and "): " in head else ""
        code = " ".join(str(x) for x in f.site if x != ())
        return f"{code}: {printed}" if printed else code
    if f.kind in ("communication", "hang") and len(f.site) >= 2:  # (what, ranks[, ("options", ...)])
        # "over budget (0, 1)" read as a pair of numbers; distinct options close it as above
        what, ranks, *rest = f.site
        return ", ".join(
            [f"{what} on ranks {list(ranks)}", *(", ".join(f"{k}={v}" for k, v in o) for _, o in rest)]
        )
    return " ".join(str(x) for x in f.site if x != ())


def fuzz_one(
    target: Any,
    impl: Any,
    config: RunConfig,
    *,
    recorder: FailureRecorder | None = None,
    stream: TextIO = sys.stderr,
    interval: float = 2.0,
    live: bool = False,
) -> Outcome:
    """Fuzz one (target, implementation): one Hypothesis run, or fresh runs until ``config.deadline``.
    Progress goes to ``stream``: the live display with ``live`` on a terminal, else a line every
    ``interval`` seconds (:mod:`shardfuzz.frontends.display`)."""
    t0 = time.perf_counter()
    hooks: list[Any] = [recorder] if recorder is not None else []
    fleet = FleetWorker.for_config(config)  # NoFleet without a Redis database
    hooks.append(fleet)
    deadline = None
    if config.deadline is not None:
        deadline = Deadline(t0 + config.deadline)
        hooks.append(deadline)
        config = config.replace(derandomize=False)
    timeline = Timeline(t0)
    hooks.append(timeline)
    runner = Runner(target, impl, config, hooks=hooks)
    label = f"{runner.target.name}/{runner.impl_name}"
    shown = runner.progress_conditions()
    out = Outcome(
        label, runner, shown=shown, drawn_shares=runner.strategy_shares(shown), timeline=timeline.samples
    )

    # the examples a run without a deadline has; with one, the examples asked beside it (or none)
    budget = settings_for(config, quiet=True).max_examples if config.deadline is None else config.max_examples

    def progress(elapsed: float | None = None) -> Progress:
        now = time.perf_counter() - t0 if elapsed is None else elapsed
        return _progress(out, config.deadline, budget, now, shown)

    display = display_for(stream, interval, live)
    already = len(recorder.written) if recorder is not None else 0  # one recorder serves every target
    # Ctrl-C stays pending for the whole campaign, between its runs too: swallowed in a garbage-
    # collector callback there (or at a run's end) it was lost, and a new user's fleet worker went
    # on to its next run and said "finished"
    with StickyInterrupt.armed():
        try:  # started inside: a Ctrl-C during a slow first heartbeat still stops the display
            display.start(progress)
            fleet.start(lambda: _heartbeat(runner, out, time.perf_counter() - t0, shown))
            with deadline.enforced() if deadline is not None else contextlib.nullcontext():
                _search_runs(out, config, recorder, fleet)
        except KeyboardInterrupt:
            out.interrupted = True
            StickyInterrupt.pending = False  # acted on: what follows must not raise it again
        except TimeUp:  # the grace timer fired just as the last run ended
            pass
        except InfrastructureError as e:
            if not out.findings:  # nothing to lose: the caller says the fuzzer failed (exit 3)
                fleet.stop("failed")
                if runner.stats.examples and len(e.args) == 1:  # what ran before it: a node lost
                    # after 755 examples said nothing of them
                    e.args = (
                        f"{e.args[0]} (after {runner.stats.examples} examples of {label}, nothing found)",
                    )
                raise
            # a node lost after the first findings: they are kept, reported and decide the exit code
            # (a driver whose torchrun node was stopped printed nothing of its finding, exit 3)
            out.failed = str(e)
        # whatever else ended the search early (the caller reports it): the last beat says it failed
        except BaseException:
            fleet.stop("failed")
            raise
        finally:
            display.stop()
            out.elapsed = time.perf_counter() - t0
            timeline.samples.append((out.elapsed, runner.stats.examples, runner.stats.failures))
            out.interrupted = out.interrupted or bool(out.result and out.result.interrupted)
        _finish(out, config, recorder, fleet, stream, overran=deadline is not None and deadline.overran)
    if recorder is not None:
        out.failure_files = list(recorder.written)[already:]  # this target's files only
    display.final(
        progress(out.elapsed),
        (" (interrupted)" if out.interrupted else "")
        + (" (an example still running after the deadline was abandoned)" if out.overran else ""),
    )
    if out.result is None and runner.stats.examples:
        out.result = Result(
            runner.target.name, runner.impl_name, runner.backend, found=False, stats=runner.stats
        )
    return out


def _finish(
    out: Outcome,
    config: RunConfig,
    recorder: FailureRecorder | None,
    fleet: FleetWorker | NoFleet,
    stream: TextIO,
    overran: bool,
) -> None:
    """After the search: the finishing phase (or the offers a cut search leaves), then the fleet
    worker's last heartbeat. It heartbeats on through that phase (a Ctrl-C or SIGTERM there is an
    interruption too: status said "finished" of one stopped while it finished a shrink)."""
    try:
        if overran:
            out.overran = True
            stop_pools()  # the abandoned example's ranks are still busy: start afresh
        if not (out.interrupted or out.failed):
            _after_search(out, out.runner, config, recorder, fleet, stream)
        else:
            _offer_deferred(out, out.runner, fleet, 0.0)  # never offered: their shrink was cut
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM past _after_search's own catch: keep what was found
        out.interrupted = True
    finally:
        fleet.stop("failed" if out.failed else "interrupted" if out.interrupted else "finished")


def _after_search(
    out: Outcome,
    runner: Runner,
    config: RunConfig,
    recorder: FailureRecorder | None,
    fleet: FleetWorker | NoFleet,
    stream: TextIO,
) -> None:
    """A campaign's findings after its search: the cut shrinks finished and the 1-rank tries (after
    a deadline both share its extra budget; else 1-rank tries get ONE_RANK_S), repeats dropped,
    each file made to hold its finding, the fleet offered what it waited for; a clean run's closest
    pass measured."""
    finishing, spent = time.perf_counter(), 0.0
    try:
        spent = _finish_cut_shrinks(out, runner, config, recorder, stream)
        if not out.interrupted:
            _try_one_rank(
                out, runner, ONE_RANK_S if config.deadline is None else finish_budget(config) - spent
            )
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while finishing: stop there, keeping every finding
        out.interrupted, spent = True, time.perf_counter() - finishing
        out.elapsed += spent
    except InfrastructureError as e:
        # the ranks lost for good while finishing (a 1-rank try, a cut shrink): the findings are
        # kept, reported and decide the exit code, as after a search that failed (a review found
        # exit 3 with nothing of the finding printed, and its fleet state "finished")
        out.failed, spent = str(e), time.perf_counter() - finishing
        out.elapsed += spent
    _drop_repeats(out, recorder)
    if recorder is not None:  # each file holds the case its finding is reported with
        out.findings = [
            (f, recorder.hold(path, f) if path is not None and f.context is not None else path)
            for f, path in out.findings
        ]
    _offer_deferred(out, runner, fleet, spent)
    _improve_fleet_copies(out, runner, fleet, spent)
    if not (out.interrupted or out.failed):
        _measure_closest_pass(out, runner)


def _search_runs(
    out: Outcome, config: RunConfig, recorder: FailureRecorder | None, fleet: FleetWorker | NoFleet
) -> None:
    """The campaign's Hypothesis runs: one, or fresh ones until the deadline, each run's findings
    settled as they come."""
    runner, seen = out.runner, set[str]()
    while True:
        if out.runs:
            StickyInterrupt.check()  # a Ctrl-C swallowed at the last run's end: no new run
        out.runs += 1
        if recorder is not None:
            recorder.begin_run(out.runs)
        fleet.begin_run()
        first = out.runs == 1  # later runs: no covering rows, no replay of saved failures
        settings = settings_for(config, quiet=True)
        if config.deadline is not None and config.max_examples is not None:  # both: whichever first
            settings = type(settings)(settings, max_examples=config.max_examples - runner.stats.examples)
        result = search(runner, settings, database=_run_database(settings, first), rows=first)
        _settle(out, result, seen, runner, recorder, fleet)
        if out.result is None or not out.result.found:
            out.result = result
        if result.failed:  # its findings are kept; the campaign ends, said beside them
            out.failed = result.failed
            return
        if result.out_of_time or config.deadline is None or result.interrupted:
            return
        if config.stop_at_first and out.findings:  # shrunk and saved: the job needed one
            return
        if config.max_examples is not None and runner.stats.examples >= config.max_examples:
            return  # the examples asked are spent before the time


def _progress(
    out: Outcome, deadline: float | None, budget: int | None, elapsed: float, shown: tuple[str, ...]
) -> Progress:
    """Where ``out``'s campaign stands after ``elapsed`` seconds; the time left is the deadline's,
    or (a ``budget`` of examples) the examples left at the rate so far (shrinking comes on top),
    whichever comes first."""
    s = out.runner.stats
    remaining: float | None = None
    if budget is not None and s.examples and elapsed > 0 and budget > s.examples:
        remaining = (budget - s.examples) * elapsed / s.examples
    if deadline is not None:  # with a budget of examples too: whichever comes first
        remaining = min(max(0.0, deadline - elapsed), remaining if remaining is not None else math.inf)
    return Progress(
        label=out.label,
        examples=s.examples,
        failing=s.failures,
        findings=len(out.findings),
        elapsed=elapsed,
        remaining=remaining,
        triggers=tuple((t, s.triggers.get(t, 0)) for t in shown),
        hangs=s.hangs,
        adaptive_timeout=out.runner.config.timeout is None,
    )


def _run_database(settings: Any, first: bool) -> Any:
    """A campaign's first run replays the database (the fleet's findings too); later runs save to
    it only, so they search elsewhere instead of replaying the known failures again."""
    return "default" if first or settings.database is None else save_only(settings.database)


def _settle(
    out: Outcome,
    result: Result,
    seen: set[str],
    runner: Runner,
    recorder: Any,
    fleet: FleetWorker | NoFleet,
) -> None:
    """Keep a run's findings that are new (by signature) and their files; count the others; offer
    each to the fleet, if any."""
    shrink = fleet.run_shrink_seconds(len(result.failures))
    for f in result.failures:
        distinct = signature_of(f) not in seen
        seen.add(signature_of(f))
        path = recorder.settle(f, distinct) if recorder is not None else None
        if getattr(f, "cut_short", None) is None:
            note = fleet.settle(stable_identity(runner), f, path, distinct, shrink)
        else:  # its signature may change as it shrinks: offered once it has (_offer_deferred)
            note = fleet.defer(stable_identity(runner), f) if distinct else None
        if distinct:
            out.findings.append((f, path))
            if note is not None:  # the case as offered: a later shrink or 1-rank try may change it here
                out.fleet.append({**note, "offered_case": repr(f.case)})
        else:
            out.rediscovered += 1


def _heartbeat(runner: Runner, out: Outcome, elapsed: float, shown: tuple[str, ...]) -> dict[str, Any]:
    """What a fleet worker says of itself every heartbeat (``shardfuzz status``)."""
    s = runner.stats
    return {
        "target": runner.target.name,
        "impl": runner.impl_name,
        "examples": s.examples,
        "per_second": s.examples / elapsed if elapsed > 0 else 0.0,
        "triggers": {t: s.triggers.get(t, 0) / s.examples for t in shown} if s.examples else {},
        "findings": len(out.findings),
        "runs": out.runs,
    }


def _finish_cut_shrinks(
    out: Outcome, runner: Runner, config: RunConfig, recorder: Any, stream: TextIO
) -> float:
    """Shrink the findings whose shrink the deadline cut further, within :func:`finish_budget` in
    all; the seconds spent."""
    cut = [i for i, (f, _) in enumerate(out.findings) if getattr(f, "cut_short", None) == "deadline"]
    budget = finish_budget(config)
    if not cut or budget <= 0:
        return 0.0
    print(
        f"{out.label}: shrinking {len(cut)} cut finding(s) further, up to {budget:g} s",
        file=stream,
        flush=True,
    )
    t0 = time.perf_counter()
    for i in cut:
        finding, path = out.findings[i]
        left = max(0.0, budget - (time.perf_counter() - t0))  # an overrun before it leaves none, not less
        done = finish_shrink(runner, finding, left, recorder=recorder, path=path)
        out.findings[i] = (done.finding, path)
        out.finished.append(done)
        if out.result is not None and out.result.failures and out.result.failures[0] is finding:
            out.result.case, out.result.report = done.finding.case, done.finding.report
        if getattr(done.finding, "cut_short", None) == "interrupted":  # Ctrl-C in its shrink: stop
            out.interrupted = True
            break
    spent = time.perf_counter() - t0
    out.elapsed += spent
    if out.result is not None and all(d.complete for d in out.finished):
        out.result.shrink_cut_short = False
    return spent


def _try_one_rank(out: Outcome, runner: Runner, budget: float) -> None:
    """Each shrunk finding on 2+ ranks tried on 1 rank with the same global sizes (within
    ``budget`` seconds in all): one that fails there too is replaced by its 1-rank case, so its
    report says it fails without a peer. (Not a finding still cut short, nor a communication
    budget exceeded: that is about communication whatever the world.)"""
    t0 = time.perf_counter()
    for i, (finding, path) in enumerate(out.findings):
        if finding.kind == "communication" or getattr(finding.case, "world_size", 1) == 1:
            continue
        if getattr(finding, "cut_short", None) is not None:
            continue
        left = max(0.0, budget - (time.perf_counter() - t0))  # an overrun before it leaves none, not less
        recorder = runner_recorder(runner)
        one = try_one_rank(runner, finding, left, recorder=recorder, path=path)
        if one is not None:
            out.findings[i] = (one, path)
            for done in out.finished:  # its "needs world size 2" line spoke of the replaced finding
                if done.finding is finding:
                    done.finding, done.kept = one, kept_features(one.case, simplest_case(runner))
            if out.result is not None and out.result.failures and out.result.failures[0] is finding:
                out.result.case, out.result.report = one.case, one.report
    out.elapsed += time.perf_counter() - t0


def _drop_repeats(out: Outcome, recorder: Any) -> None:
    """A finding shrunk further after its run (a cut shrink finished, a 1-rank try) may reach the
    signature of another finding of the campaign (a mismatch found at world 3 and at world 2,
    both shrunk to world 2): it is one finding, kept once (the first), counted as found again, and
    the failure file of the repeat is removed. (A fleet keeps what each run offered it.)"""
    seen: set[str] = set()
    kept, notes, repeats = [], [], []
    for i, (finding, path) in enumerate(out.findings):
        signature = signature_of(finding)
        if signature not in seen:
            seen.add(signature)
            kept.append((finding, path))
            notes += out.fleet[i : i + 1]  # the fleet's note stays beside its own finding
            continue
        out.rediscovered += 1
        repeats.append(path)
    if recorder is not None:
        # never a file a kept finding's writes went to as well
        holding = {recorder.where(path) for _, path in kept if path is not None}
        for path in repeats:
            if path is not None and recorder.where(path) not in holding:
                recorder.discard(path)
    out.findings, out.fleet = kept, notes


def _offer_deferred(out: Outcome, runner: Runner, fleet: FleetWorker | NoFleet, spent: float) -> None:
    """Each finding whose shrink was cut, now shrunk as far as the campaign goes, offered to the
    fleet under its signature now; after Ctrl-C or SIGTERM none is offered (its case is the
    smallest seen when it was cut: the failure file keeps it, a replay shrinks it further)."""
    for i, (finding, path) in enumerate(out.findings):
        note = out.fleet[i] if i < len(out.fleet) else None
        if note is None or note["fleet"] != "pending":
            continue
        cut = getattr(finding, "cut_short", None)
        if cut == "interrupted" or (out.interrupted and cut is not None):  # still as Ctrl-C left it
            out.fleet[i] = {**note, "fleet": "not offered"}
            continue
        offered = fleet.settle(stable_identity(runner), finding, path, True, spent / len(out.findings))
        if offered is not None:
            out.fleet[i] = {**offered, "offered_case": repr(finding.case)}


def _improve_fleet_copies(out: Outcome, runner: Runner, fleet: FleetWorker | NoFleet, spent: float) -> None:
    """A finding this worker stored in the fleet and shrunk further since (a cut shrink finished, a
    1-rank try), its signature unchanged, replaces the fleet's copy: the fleet holds the smallest
    case its finder reached. (A changed signature is another finding: the summary names the case
    the fleet holds.)"""
    for i, (finding, path) in enumerate(out.findings):
        note = out.fleet[i] if i < len(out.fleet) else None
        if note is None or note["fleet"] != "new" or repr(finding.case) == note.get("offered_case"):
            continue
        if fleet.improve(stable_identity(runner), finding, path, note["id"], spent / len(out.findings)):
            out.fleet[i] = {**note, "offered_case": repr(finding.case)}


def _measure_closest_pass(out: Outcome, runner: Runner) -> None:
    """A clean run's closest pass, when it is an upper bound (judged without the noise term), is
    judged again with the noise term, once, on a runner of its own (the run's statistics stay as
    they are): the summary then says what that case really measures. The bound over all passes
    stays the upper bound; this is the one case it came from. Then the case of the figure the
    summary leads with, at 0.5 or more, is judged with the recheck's samples (recheck_closest_pass)."""
    try:
        out.closest_measured, out.closest_rerun_failed = measure_closest_pass(runner)
        if out.closest_rerun_failed is None:
            out.closest_rechecked, out.closest_rerun_failed = recheck_closest_pass(
                runner, out.closest_measured
            )
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while measuring: the run's figures stand as they are
        out.interrupted = True


def runner_recorder(runner: Runner) -> FailureRecorder | None:
    """The failure-file recorder among a runner's hooks (None: no files)."""
    return next((h for h in runner.hooks if isinstance(h, FailureRecorder)), None)


#: the most frequent leaks the summary table names (the rest are counted)
LEAKS_SHOWN = 5
#: reasons for refusal whose first case's rerun command the summary shows
REFUSED_RERUNS_SHOWN = 2
#: a layout finding's first problem, as the summary names it, at most this long
LINE_LIMIT = 160
#: a run that refused at least this share of its drawn cases as unsupported says so
REFUSED_SHARE = 0.25
#: the engine's refusals of cases whose values the case dtype cannot hold
DTYPE_RANGE_REASONS = (ORACLE_OVERFLOWS, BEYOND_RANGE, EDGE_OVERFLOWS)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """The campaign's summary: one line per target and implementation with its result in words,
    then under it the findings, the lines of shrinking finished after the deadline, the faults and
    leaks, and any failure file no finding names."""
    # --workers: rows alike but for the job
    impls = [r["impl"] + (f" [job {r['job']}]" if r.get("job") else "") for r in rows]
    # columns as wide as their longest entry (torch_loss_parallel_weight_ignore pushed its row's
    # figures out from under their headings)
    tw = max([16, *(len(r["target"]) for r in rows)])
    iw = max([24, *map(len, impls)])
    head = f"{'target':<{tw}} {'implementation':<{iw}} {'examples':>8} {'ex/s':>7} {'runs':>4}  {'result'}"
    lines = [head, "-" * len(head)]
    for r, impl in zip(rows, impls):
        res = _outcome_words(r) + _count_words(r)
        lines.append(
            f"{r['target']:<{tw}} {impl:<{iw}} {r['examples']:>8} {r['per_second']:>7.1f} {r['runs']:>4}  {res}"
        )
        sub = []  # the lines under the row, written at 16 and moved under a wider target column
        # not where every compared element was equal: any case is as close (an exact target named
        # one, the same in two runs, and a new user looked for what was special about it)
        exact = not r.get("closest_pass") and not r.get("measured_pass_ratio")
        if not r["found"] and r.get("closest_pass_case") and not exact:
            # "measured at": the case of the figure the result leads with, not the bound's (a new
            # user could not tell which of the two figures the case was of)
            measured = r.get("closest_pass_upper_bound") and (
                r.get("closest_pass_measured") is not None or r.get("measured_pass_ratio")
            )
            sub.append(f"{'':<16} closest pass {'measured ' if measured else ''}at {r['closest_pass_case']}")
        for f in r.get("findings", []):
            sub += _finding_lines(f)
        sub += [f"{'':<16} {line}" for line in r.get("finished", [])]
        sub += _fault_lines(r)
        listed = {f.get("file") for f in r.get("findings", [])}
        sub += [f"{'':<16} failure file: {path}" for path in r.get("failure_files", []) if path not in listed]
        lines += [" " * (tw - 16) + line for line in sub]
    return "\n".join(lines)


def _outcome_words(r: dict[str, Any]) -> str:
    """What a row's search found and how it ended: whether its case is the smallest (shrinking cut
    short, or finished after the deadline) and whether an example was abandoned at the deadline."""
    # every kind among the distinct findings ("FOUND hang: 2 distinct findings" hid a mismatch)
    kinds = [k for k in dict.fromkeys([r.get("kind"), *(f.get("kind") for f in r.get("findings", []))]) if k]
    res = (
        f"FOUND {', '.join(kinds)}"
        if r["found"]
        else ("interrupted" if r["interrupted"] else "nothing found")
    )
    if r.get("cut_short"):
        res += " (shrinking cut short: the smallest case found so far)"
    elif r.get("finished"):
        res += " (shrinking cut by the deadline, then finished)"
    if r.get("overran"):
        res += " (an example still running after the deadline was abandoned)"
    return res


def _cases(n: int) -> str:
    return "case" if n == 1 else "cases"


def _count_words(r: dict[str, Any]) -> str:
    """What a row counted beside its result: cases rejected or excluded, how close a clean run came
    to failing, how many distinct findings and how many of them were found before."""
    res = ""
    # "more": not among the examples counted (a new user could not tell whether they were)
    if r.get("unsupported"):
        res += f" ({r['unsupported']} more {_cases(r['unsupported'])} drawn, rejected as unsupported)"
    if r.get("excluded"):
        res += f" ({r['excluded']} more {_cases(r['excluded'])} drawn, excluded as known failures)"
    if r.get("budgets_elsewhere"):
        res += (
            f" (communication not checked: no budget for {r['impl']}; the target has one for "
            f"{', '.join(r['budgets_elsewhere'])})"
        )
    if not r["found"] and r["examples"]:
        res += "; closest pass " + closest_pass_words(
            r.get("closest_pass", 0.0),
            bool(r.get("closest_pass_upper_bound")),
            r.get("closest_pass_measured"),
            r.get("closest_pass_rerun_failed"),
            r.get("measured_pass_ratio", 0.0),
            r.get("closest_pass_rechecked"),
        )
    if len(r.get("findings", [])) > 1:
        res += f": {len(r['findings'])} distinct findings"
    if r.get("rediscovered"):
        res += f" ({r['rediscovered']} found again)"
    if r["found"] and r.get("first_failure_at"):  # the examples column counts the shrinking too
        res += f"; first failing example: {r['first_failure_at']} of {r['examples']}"
    return res


#: a condition is "rarely reached" when a run of at least this many examples met it in under
#: ``RARE_FACTOR`` of the share of the strategy's draws that meet it (that share at least
#: ``RARE_DRAWN``)
RARE_MIN_EXAMPLES, RARE_FACTOR, RARE_DRAWN = 200, 0.25, 0.2


def rarely_reached(s: Stats, drawn: dict[str, float]) -> list[tuple[str, float, float, int]]:
    """(condition, the run's share, the strategy's share, the excluded cases that met it) of each
    condition a long run met far less often than its strategy draws it."""
    if s.examples < RARE_MIN_EXAMPLES:
        return []
    out = []
    for t, share in drawn.items():
        run = s.triggers.get(t, 0) / s.examples
        if share >= RARE_DRAWN and 0 < run < RARE_FACTOR * share:  # 0: said as never reached
            out.append((t, run, share, s.excluded_triggers.get(t, 0)))
    return out


def _set_aside_line(n: int, drawn: int, how: str, fix: str = "") -> str:
    """The summary's line for ``n`` of ``drawn`` cases set aside (refused, excluded): what ran is
    what was left."""
    return (
        f"{'':<16} {n} of {drawn} drawn cases ({100 * n / drawn:.0f}%) were {how}, so the conditions "
        f"reached are those of what was left" + (f"; {fix}" if fix else "")
    )


def _rare_line(rarely: list) -> str:
    """The summary's "rarely reached" line: why each was rare (the search dwelt elsewhere, or the
    run excluded its cases: a new user's --exclude of sizes the group does not divide left
    "uneven 2%", put down to the search) and what pins one."""
    rare = ", ".join(
        f"{t} {100 * run:.0f}% (of the strategy's draws: {100 * drawn:.0f}%"
        + (f"; {excluded} {_cases(excluded)} that met it excluded as known failures)" if excluded else ")")
        for t, run, drawn, excluded in rarely
    )
    excluded = [n > 0 for *_, n in rarely]
    why = "the search dwelt on other cases (it steers towards the largest error/tolerance)"
    if all(excluded):
        why = "exclusions set their cases aside"
    elif any(excluded):
        why += ", or exclusions set their cases aside"
    return (
        f"{'':<16} rarely reached: {rare}: {why}; pin a dtype, a world size or an option with "
        "--dtypes, --world-sizes or --option for a run of its own"
    )


def _finding_lines(f: dict[str, Any]) -> list[str]:
    """One finding's lines: its kind, site, margin and case, then the notes that apply to it (it
    fails on one rank too, what the fleet says of it, its failure file)."""
    why = f.get("margin_why")
    if f.get("widest"):  # the shrunk case is the smallest, not the clearest
        why = "; ".join(w for w in (why, f"{f['widest']:.3g}x on larger failing cases before shrinking") if w)
    margin = f", margin {margin_text(f['margin'], why)}" if f.get("margin") is not None else ""
    site = f" ({f['site']})" if f.get("site") else ""
    lines = [f"{'':<16} - {f['kind']}{site}{margin}: {f['case']}"]
    if f.get("cut_short"):
        lines.append(f"{'':<16}   shrinking cut short ({f['cut_short']}): the smallest case found so far")
    if f.get("one_rank"):
        lines.append(f"{'':<16}   {ONE_RANK_SHORT}")
    if f.get("fleet"):
        lines.append(f"{'':<16}   fleet finding {f['id']}: {fleet_note(f)}")
        if f.get("offered_case") not in (None, f["case"]):
            lines.append(
                f"{'':<16}   offered to the fleet before it was shrunk further here, as {f['offered_case']}"
            )
    if f.get("file"):
        lines.append(f"{'':<16}   failure file: {f['file']}")
    return lines


def _precision_lines(r: dict[str, Any]) -> list[str]:
    """A clean run's lines for what its 16-bit cases could not judge (outputs wider than the case
    dtype; the run's dtypes all 16-bit)."""
    lines: list[str] = []
    if r.get("wider_outputs") and not r["found"]:
        by_kind: dict[str, list[str]] = {}
        for name, kind in r["wider_outputs"].items():
            by_kind.setdefault(kind, []).append(name)
        wider = "; ".join(f"{', '.join(names)} ({kind})" for kind, names in by_kind.items())
        lines.append(
            f"{'':<16} judged at the case dtype's bound: {wider}; a bug in their own arithmetic can pass "
            "there: run float32 cases too, or give them a fixed tolerance (docs/explanation/noise-model.md, "
            "mixed precision)"
        )
    elif r.get("only_dtypes") and not r["found"]:
        lines.append(
            f"{'':<16} {' and '.join(r['only_dtypes'])} cases only: a bug smaller than one rounding of "
            "their outputs (an update under their resolution) passes there; float32 cases judge it"
        )
    return lines


def _checked_little_lines(r: dict[str, Any]) -> list[str]:
    """A clean run's lines for passes that checked little: degenerate outputs, bounds as wide as
    the output, value profiles that changed no input."""
    if r["found"]:
        return []
    said = (
        ("degenerate", degenerate_line),
        ("wide_bounds", wide_bound_line),
        ("inert_profiles", inert_profile_line),
    )
    return [f"{'':<16} {line(r[key])}" for key, line in said if r.get(key)]


def _fault_lines(r: dict[str, Any]) -> list[str]:
    """The summary's lines for what a row counted but is no finding: the reasons cases were
    rejected as unsupported or excluded, external faults and leaks."""
    lines = []
    if r.get("external_faults"):
        lines.append(
            f"{'':<16} external faults set aside (a rank died, and the case passed on fresh ranks): "
            f"{r['external_faults']}"
        )
    for key, words in (
        ("unsupported", "rejected as unsupported"),
        ("excluded", "excluded as known failures"),
    ):
        reasons = r.get(f"{key}_reasons")
        if reasons:
            # an --exclude that matched nothing is listed too (the docs promise each): said as such,
            # "x0" alone read as a display bug to a new user
            shown = "; ".join(f"{k} x{v}" + ("" if v else " (matched no case)") for k, v in reasons.items())
            more = r.get(key, 0) - sum(reasons.values())
            rest = (
                f"; and {more} more {_cases(more)}, for reasons not shown" if more > 0 else ""
            )  # cases, not reasons
            lines.append(f"{'':<16} {words}: {shown}{rest}")
    firsts = r.get("unsupported_first") or {}
    for reason, rerun in list(firsts.items())[:REFUSED_RERUNS_SHOWN]:
        lines.append(f"{'':<16} the first refused ({reason}): {rerun}")
    refused, drawn = r.get("unsupported", 0), r.get("unsupported", 0) + r.get("examples", 0)
    # said of a clean run's coverage: a finding's shrink draws tiny cases a target often refuses
    # (63% of 27 in a new user's batch norm, found at example 1, against 19-27% in its clean runs)
    if drawn and refused >= REFUSED_SHARE * drawn and not r["found"]:
        reasons = r.get("unsupported_reasons") or {}
        top = max(reasons, key=reasons.__getitem__) if reasons else None
        # the engine's own refusals are no strategy's to fix (a new user's float16 loss scaler,
        # 251 of 551 refused as oracle overflows, was sent to the strategies page)
        fix = (
            "most by the engine, where the case dtype cannot hold the values: keep the large profile "
            "away from that dtype, or compute those values in float32 (docs/explanation/noise-model.md)"
            if top in DTYPE_RANGE_REASONS
            else "draw only cases the implementation supports (docs/reference/strategies.md)"
        )
        lines.append(
            _set_aside_line(refused, drawn, "refused as unsupported: Hypothesis steers away from them", fix)
        )
    # a new user's exclusions set aside 1,136 drawn cases to run 150, unsaid
    excluded, drawn = r.get("excluded", 0), r.get("excluded", 0) + r.get("examples", 0)
    if excluded and excluded >= REFUSED_SHARE * drawn and not r["found"]:
        lines.append(_set_aside_line(excluded, drawn, "excluded as known failures"))
    if r.get("never_reached") and not r["found"]:
        lines.append(f"{'':<16} never reached: {', '.join(r['never_reached'])} (no example met them)")
    if r.get("out_of_reach_of_pins") and not r["found"]:
        lines.append(
            f"{'':<16} out of reach of the pinned options (--option): {', '.join(r['out_of_reach_of_pins'])} "
            "(the target reaches them, no case with these options can): a bug that needs them cannot show here"
        )
    if r.get("rarely_reached") and not r["found"]:
        lines.append(_rare_line(r["rarely_reached"]))
    lines += _precision_lines(r)
    lines += _checked_little_lines(r)
    for text, (key, n) in (r.get("exclude_missing") or {}).items():
        lines.append(f"{'':<16} --exclude {text!r} excluded nothing: {n} cases had no {key} (a misspelling?)")
    if r.get("leaks"):
        shown = ", ".join(f"{k} x{v}" for k, v in r["leaks"].items())
        more = r.get("leaks_total", 0) - sum(r["leaks"].values())
        lines.append(
            f"{'':<16} leaks (not findings; restored, or the pool restarted): {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    return lines


#: a clean run says how many passes compared nothing from this share of its passing examples on
DEGENERATE_SHARE = 0.2
#: the dtypes whose runs alone get a line (wider outputs judged at their bound; a bug under one
#: of their roundings passes them)
LOW_PRECISION = frozenset({"bfloat16", "float16"})
#: a size named beside a degenerate output was 1 at least this many times as often in those passes
#: as in all of them: a size the strategy draws small anyway (heads 1 in 79% of a causal
#: attention's degenerate passes, and in as many of all) is no cause, and sent a new user looking
#: there instead of at seq 1
DEGENERATE_LIFT = 1.5


def degenerate_record(s: Stats) -> dict[str, Any]:
    """The passing examples whose every output was all zero or constant, when they are at least
    :data:`DEGENERATE_SHARE` of the passes, and the outputs that were so in that share (or {})."""
    if not s.passed:
        return {}
    outputs = {k: v for k, v in s.degenerate_outputs.most_common() if v >= DEGENERATE_SHARE * s.passed}
    many = DEGENERATE_SHARE * s.passed
    if s.degenerate_passes < many and s.empty_passes < many and not outputs:
        return {}
    # per output, a size that was 1 in most of its degenerate passes, and far more often there than
    # in all passes (DEGENERATE_LIFT): where to look
    at_one = {}
    for name, n in outputs.items():
        sizes = [
            (c / max(s.passes_at_one[k], c) * s.passed / n, c, k)
            for (o, k), c in s.degenerate_at_one.items()
            if o == name and c > n / 2
        ]
        lift, c, k = max(sizes, default=(0.0, 0, ""))
        if lift >= DEGENERATE_LIFT:
            at_one[name] = [k, c, s.passes_at_one[k]]
    return {
        "passes": s.degenerate_passes,
        "of": s.passed,
        "outputs": outputs,
        "at_one": at_one,
        "empty": s.empty_passes,
    }


def _at_one_words(at_one: list, n: int, passed: int) -> str:
    size, count, *overall = at_one  # a record of an older version has no overall count
    said = f"{size} 1 in {100 * count / n:.0f}% of them"
    return said + (f", in {100 * overall[0] / passed:.0f}% of all passes" if overall else "")


def degenerate_line(d: dict[str, Any]) -> str:
    """The summary's line for :func:`degenerate_record`."""
    said = []
    empty = d.get("empty", 0)  # a record of an older version has none
    if empty >= DEGENERATE_SHARE * d["of"]:
        said.append(
            f"{empty} of {d['of']} passing examples ({100 * empty / d['of']:.0f}%) compared no element: "
            "every output was empty (a size or an option of 0, drawn or pinned)"
        )
    if d["passes"] >= DEGENERATE_SHARE * d["of"]:
        said.append(
            f"{d['passes']} of {d['of']} passing examples ({100 * d['passes'] / d['of']:.0f}%) had every "
            "output all zero or constant in the oracle, where a sum, a scale or an order gone wrong cannot show"
        )
    at_one = d.get("at_one", {})
    some = ", ".join(
        f"{k} {100 * v / d['of']:.0f}%"
        + (f" ({_at_one_words(at_one[k], v, d['of'])})" if k in at_one else "")
        for k, v in d["outputs"].items()
    )
    if some:
        said.append(f"outputs all zero or constant in passing examples: {some}")
    return (
        # "right there" first: a new user's recurrence, whose decay gradient is 0 at seq 1 by the math,
        # read the line as a sign that something was wrong
        "; ".join(said) + " (often right there: an option or size that makes the code do nothing, such "
        "as a dropout p near 1, a softmax over one element or a recurrence over one step; but a pass "
        "there shows nothing of that output, so make those cases rare in the strategy, e.g. a size's "
        "lower bound (Free(2, N); Split(min_size=2) for a split size) or the value in sst.mostly(...): "
        "docs/reference/strategies.md)"
    )


def inert_profile_line(inert: dict[str, int]) -> str:
    """The summary's line for :func:`~shardfuzz.engine.degenerate.inert_profiles`."""
    some = ", ".join(f"{p} ({n} passing example{'s' if n != 1 else ''})" for p, n in inert.items())
    return (
        f"value profiles that changed no input: {some}: each of those examples was a normal-profile case "
        "again. large and small scale only the tensors of role activation or cotangent, ties every role "
        "but cotangent; give the inputs they should reach such a role in randn(..., role=...), or draw "
        "fewer profiles (sst.cases(..., profiles=...): docs/reference/strategies.md)"
    )


#: a clean run names an output whose allowed error was as wide as the output in this share of its passes
WIDE_BOUND_SHARE = 0.2


def wide_bound_record(s: Stats) -> dict[str, Any]:
    """The outputs whose allowed error was at least their value at every element (a zero answer
    would have passed) in :data:`WIDE_BOUND_SHARE` of the passes or more, with their counts (or {})."""
    outputs = {
        k: v for k, v in s.wide_bound_outputs.most_common() if s.passed and v >= WIDE_BOUND_SHARE * s.passed
    }
    return {"of": s.passed, "outputs": outputs} if outputs else {}


def wide_bound_line(d: dict[str, Any]) -> str:
    """The summary's line for :func:`wide_bound_record`."""
    some = ", ".join(f"{k} {100 * v / d['of']:.0f}%" for k, v in d["outputs"].items())
    return (
        "passes where an output's allowed error was as large as the output itself (a zero answer would "
        f"have passed): {some}. The bound is that wide where the inputs make the computation "
        "ill-conditioned in the case dtype (a normalisation over a few features, or over values offset "
        "far from their spread; a gradient that is zero up to rounding) or where a fixed tolerance is: "
        "those passes checked little of that output; draw such inputs rarer "
        "(docs/reference/strategies.md)"
    )


def fleet_note(note: dict[str, Any]) -> str:
    """What the fleet says of a finding, in words (summary and report lines)."""
    if note["fleet"] == "new":
        return "new, stored in the fleet"
    if note["fleet"] == "lost":
        return "not stored (the shared database was lost; it is in the local failure file)"
    if note["fleet"] == "not offered":
        return (
            "not offered to the fleet: the campaign was stopped while it shrank (the failure file keeps it)"
        )
    return f"a rediscovery (first found by {note.get('found_by')} at {note.get('found_at')})"
