"""The runner: one case of one (target, implementation, backend) on a warm pool, judged against the
oracle. Statistics and the adaptive example timeout live here too.

Leaks (global state an example left behind, see :mod:`shardfuzz.ranks.task`) are not findings: the ranks
restore what they can, the pool restarts when they cannot, and every leak is counted in
``Stats.leaks``, printed in the summary, and appended to the report of a finding in the same example.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import shlex
from collections.abc import Sequence
from typing import Any, NoReturn

import torch

from shardfuzz.case import Case
from shardfuzz.engine import covering
from shardfuzz.engine.config import RunConfig, bind_address, check_world_size, env_int, format_tolerance
from shardfuzz.engine.degenerate import is_degenerate
from shardfuzz.engine.finding import FindingContext, inputs_hash
from shardfuzz.engine.hooks import RunHooks
from shardfuzz.engine.selforacle import SELF, self_expected
from shardfuzz.engine.stats import Stats
from shardfuzz.errors import Finding, InvalidArgument, RankSetupError, TargetError, Unsupported
from shardfuzz.limits import default_device
from shardfuzz.protocol import Completed, Hung, RankDied, RankFailed, Reply, Task, UnsupportedReply
from shardfuzz.ranks.faults import ProcessState, confirm_death
from shardfuzz.ranks.gpu import check_placement
from shardfuzz.ranks.pool_cache import connect_rank_servers, discard_pool, get_pool
from shardfuzz.ranks.regroup import regroup
from shardfuzz.ranks.secret import load_secret
from shardfuzz.ranks.spawn import hard_cap, start_forkserver
from shardfuzz.report.findings import Reporter, shell_quote
from shardfuzz.report.tracebacks import hide_for_findings as __tracebackhide__  # noqa: F401 (read by pytest)
from shardfuzz.spec import registry
from shardfuzz.spec.bounds import bounds_of, check_in_bounds
from shardfuzz.spec.exclude import Excluded, exclusion
from shardfuzz.spec.placements import check_dtensor_inputs
from shardfuzz.spec.refs import pythonpath_prefix
from shardfuzz.spec.target import Target
from shardfuzz.spec.triggers import conditions_met, triggers_of
from shardfuzz.verdict.comm import over_budget
from shardfuzz.verdict.decide import DecideConfig, decide
from shardfuzz.verdict.judge import Verdict
from shardfuzz.verdict.oracle import Expected, evaluate_oracle, supports

#: the example timeout (the no-progress window) is one of these; a busy example may run on up to
#: :func:`~shardfuzz.ranks.spawn.hard_cap` of it
TIMEOUT_BUCKETS = (2, 3, 5, 10, 20, 30, 60)

_driver_ready = False


def _prepare_driver() -> None:
    """One OpenMP thread in the driver too: 2 cores, 4 ranks and a spinning driver is 6x slower."""
    global _driver_ready
    if not _driver_ready:
        if "OMP_NUM_THREADS" not in os.environ or os.environ.get("SHARDFUZZ_DRIVER_THREADS"):
            torch.set_num_threads(env_int("SHARDFUZZ_DRIVER_THREADS", 1, 1))
        _driver_ready = True


class TimeoutPolicy:
    """Example timeout per (target, world size): adaptive from recent passing examples, or fixed.

    The timeout is the *window*: an example hangs when no rank used CPU for that long (see
    :class:`~shardfuzz.ranks.spawn.ProgressWatch`); while ranks compute, it may run on up to the hard cap
    (:func:`~shardfuzz.ranks.spawn.hard_cap`: max(120 s, 10 x the window)), which is also the gloo
    timeout of the ranks' groups. Adaptive: ``max(floor, factor * slowest of the last 50 passing
    examples)``, from the target's passes at its other world sizes before five have passed at
    this one, ``initial`` before five have passed at any, rounded up to a bucket (2, 3, 5,
    10, 20, 30, 60 s; at most 60 s). The runner does not record the first pass of a target on a
    freshly started pool, which pays the ranks' imports.
    """

    def __init__(self, floor: float = 3.0, initial: float = 10.0, factor: float = 20.0) -> None:
        self.floor, self.initial, self.factor = floor, initial, factor
        self.recent: dict[tuple, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=50)
        )

    def timeout(self, key: tuple, fixed: float | None = None) -> float:
        if fixed is not None:
            return float(fixed)
        seen: Sequence[float] = self.recent[key]
        if len(seen) < 5:
            # the target's passes at its other world sizes, where it has five: a hang at a world
            # size it rarely passed at waited the 10 s initial window at every shrink step (a new
            # user's Ulysses hang took 150 s to shrink, 15 s with --timeout 2)
            seen = [
                t for k, ts in list(self.recent.items()) if _siblings(k, key) and len(ts) >= 5 for t in ts
            ]
        value = self.initial if len(seen) < 5 else max(self.floor, self.factor * max(seen))
        return float(next((b for b in TIMEOUT_BUCKETS if b >= value), TIMEOUT_BUCKETS[-1]))

    def record(self, key: tuple, seconds: float) -> None:
        self.recent[key].append(seconds)


def _siblings(a: tuple, b: tuple) -> bool:
    """Keys of one target, backend and device at other world sizes (:meth:`Runner._timeout_key`)."""
    return a != b and len(a) == len(b) >= 2 and a[0] == b[0] and a[2:] == b[2:]


TIMEOUTS = TimeoutPolicy()


class Runner:
    """Runs cases of one (target, implementation, backend) and checks them against the oracle."""

    def __init__(
        self,
        target: Any,
        impl: Any = None,
        config: RunConfig | None = None,
        *,
        hooks: Sequence[RunHooks] = (),
    ) -> None:
        if config is not None and not isinstance(config, RunConfig):
            raise InvalidArgument(f"config={config!r}; must be a shardfuzz.RunConfig")
        start_forkserver()  # its preloading overlaps with the imports of the target and the search
        self.config = config or RunConfig()
        self.hooks = tuple(hooks)
        for h in self.hooks:
            if not isinstance(h, RunHooks):
                raise InvalidArgument(
                    f"hooks contains {h!r}; hooks must be shardfuzz.engine.hooks.RunHooks objects"
                )
        self.target: Target = registry.get_target(target)
        self.target_spec = registry.target_spec(self.target)  # rerun lines work from any folder
        self.impl_ref = self.target.impl_ref(impl)
        self.impl_name = self.target.impl_name(impl)
        self._impl = impl  # as the caller named it: a runner with other hooks keeps the name
        self.worker_target = self.target.worker_ref()
        self.stats = Stats()
        self.rank_servers = None  # the torchrun world that runs the cases (--ranks), waited for here
        if self.config.ranks is not None:
            self.rank_servers = connect_rank_servers(
                bind_address(self.config.ranks),
                load_secret(self.config.secret_file),
                self.config.backend,
                str(self.config.device),
                self.config.debug_collectives,
                hard_cap(TIMEOUTS.initial),
                # a --duration bounds the wait too, as it bounds the campaign (by it plus the grace):
                # without it, servers that never came kept a 1-minute run waiting 5 minutes
                self.config.deadline,
            )
        self._confirming = False  # rerunning a case whose rank died (shardfuzz.ranks.faults)
        #: what the run's strategy declares it draws (:meth:`check_drawn`), read at the first draw
        self._declared: tuple | None = None
        self.deaths_set_aside: set[str] = set()  # cases whose rank death did not recur (reprs)
        self._driver_state = ProcessState("the driver")  # the target's inputs and oracle run here
        #: numerics flags reported by rank 0 of the first example
        self.numerics: dict[str, Any] | None = None
        #: the full inputs of the last case the oracle ran (failure files hash them)
        self.last_inputs: dict[str, Any] = {}
        self.last_traces: dict[int, tuple] = {}  # the collectives of the last judged example
        #: the last judged example's verdict: its outputs' ratios, and whether its worst ratio was
        #: judged without the noise term (an upper bound)
        self.last_verdict: Verdict | None = None
        #: judge every example with the noise term, never as a sure pass (``shardfuzz case``)
        self.always_noise = False
        #: widen the noise of every example judged with it by the recheck's samples, as a failure's
        #: is (DecideConfig.recheck; with always_noise, every example's)
        self.recheck = False
        self.trace = True  # record the collectives (off: benchmarks/trace_cost.py's baseline)
        #: the run's tolerance: the target's per-output overrides, then the run's own on top
        self.tolerance = dataclasses.replace(
            self.config.tolerance,
            per_output=dict(self.target.tolerance) | dict(self.config.tolerance.per_output),
        )
        impl_arg = self.impl_name if self.impl_name in self.target.implementations else str(self.impl_ref)
        self.reporter = Reporter(
            self.target.name,
            self.impl_name,
            str(self.impl_ref),
            self.config.backend,
            # quoted for a shell: a bound implementation's "(bug='x')" or a path with a space
            f"{self.import_path_prefix()}shardfuzz case {_for_shell(str(self.target_spec))} --impl "
            f"{_for_shell(impl_arg)}{rerun_flags(self.config)}",
            self.tolerance,
            self_oracle=self.target.oracle == SELF,
            distinct=tuple(self.target.distinct),
            conditions=functools.partial(conditions_met, self.target),
        )

    def import_path_prefix(self) -> str:
        """``PYTHONPATH=... `` for a command printed to rerun this runner's code elsewhere, where
        its modules import from folders only this process has on its import path (pytest's root,
        a script's folder); else nothing."""
        return pythonpath_prefix([self.worker_target, self.impl_ref.ref])

    def with_hooks(self, hooks: Sequence[RunHooks]) -> Runner:
        """A new runner of the same target, implementation (named as this one was: its failure
        files and rerun lines say the same) and configuration, with ``hooks`` instead."""
        return Runner(self.target, self._impl, self.config, hooks=hooks)

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def device(self) -> str:
        return self.config.device or "cpu"

    @property
    def key(self) -> str:
        return f"{self.target.name}/{self.impl_name}/{self.backend}"

    def strategy(self) -> Any:
        return self.target.strategy(self.world_sizes(), self.config.dtypes, self.config.options)

    def world_sizes(self) -> tuple[int, ...] | None:
        """The world sizes to draw: the run's, else on rank servers the target's own up to the size
        of their world."""
        if self.rank_servers is None:
            return self.config.world_sizes
        if self.config.world_sizes is not None:
            # asked for more ranks than torchrun gave: the user's to fix (it was exit 3, "the
            # fuzzer itself failed", on the first such case)
            above = [w for w in self.config.world_sizes if w > self.rank_servers.world_size]
            if above:
                raise InvalidArgument(
                    f"world_sizes={list(self.config.world_sizes)} on a torchrun world of "
                    f"{self.rank_servers.world_size} rank servers ({above} above it): draw world sizes "
                    f"up to {self.rank_servers.world_size} (--world-sizes) or start more ranks"
                )
            return self.config.world_sizes
        drawn = sorted({w for b in bounds_of(self.target.strategy()) or () for w in b.worlds})
        fit = tuple(w for w in drawn if w <= self.rank_servers.world_size)
        if fit == tuple(drawn):  # the target's own draws, unchanged: the same cases as local ranks
            return None
        if not fit:
            raise InvalidArgument(
                f"ranks={self.config.ranks!r}: a world of {self.rank_servers.world_size} rank servers; "
                f"{self.target.name} draws world sizes {drawn}"
            )
        return fit

    def progress_conditions(self) -> tuple[str, ...]:
        """The trigger conditions a run's progress line and statistics show, 0% included
        (:func:`shardfuzz.engine.covering.progress_conditions`)."""
        return covering.progress_conditions(self)

    def out_of_reach_of_pins(self) -> tuple[str, ...]:
        """The target's trigger conditions the run's pinned options take out of reach
        (:func:`shardfuzz.engine.covering.out_of_reach_of_pins`)."""
        return covering.out_of_reach_of_pins(self)

    def strategy_shares(self, conditions: Sequence[str]) -> dict[str, float]:
        """The share of the strategy's draws that meets each of ``conditions``
        (:func:`shardfuzz.engine.covering.strategy_shares`)."""
        return covering.strategy_shares(self, conditions)

    def rerun_command(self, case: Case) -> str:
        return self.reporter.rerun_command(case)

    # -- one example ----------------------------------------------------------------------
    def run_case(self, case: Case) -> float:
        """Run one case on the ranks and compare. Returns the worst error/tolerance; raises a Finding."""
        _prepare_driver()
        self._check_case(case)
        for hook in self.hooks:
            hook.before_example(self, case)
        self._admit(case)
        try:
            ratio, elapsed = self._run_in_clean_driver(case)
        except Finding as f:
            self.stats.examples += 1  # an example once it has a verdict (never one still running)
            self.stats.count_finding(f)
            f.context = self.finding_context(case, f)  # once, for every hook and the caller
            for hook in self.hooks:
                hook.on_finding(f.context, f)
            raise
        self.stats.examples += 1
        upper_bound = self.last_verdict is not None and self.last_verdict.upper_bound
        self.stats.note_pass(ratio, case, upper_bound=upper_bound)
        self._note_wider_outputs(case)
        self._note_degenerate(case)
        if elapsed is not None:
            TIMEOUTS.record(self._timeout_key(case), elapsed)
        return ratio

    def _note_wider_outputs(self, case: Case) -> None:
        """Outputs a 16-bit case's oracle gives in float32 or float64 (master weights, optimizer
        state) and no fixed tolerance judges: their bound is the case dtype's, where a bug in their
        float32 arithmetic can pass (a new user's bfloat16-only run missed a per-shard RMS of an
        Adafactor update, found at once in float32 cases)."""
        verdict = self.last_verdict
        self.stats.pass_dtypes.add(case.dtype)
        if verdict is None or case.dtype not in ("bfloat16", "float16"):
            return
        for od in verdict.diffs:
            if od.dtype in ("float32", "float64") and self.tolerance.for_output(od.name) is None:
                self.stats.wider_outputs.setdefault(od.name, f"{od.dtype} in {case.dtype} cases")

    def _note_degenerate(self, case: Case) -> None:
        """Count the passing example's outputs that the oracle gave all zero or constant (a new
        user's dropout at p = 0.999 passed a whole run "at 0 (every compared element equal)",
        which read as a strong pass where nothing was compared)."""
        verdict = self.last_verdict
        if verdict is None:
            return
        ones = [k for k, v in case.sizes.items() if v == 1]  # the usual cause, said beside the share
        self.stats.passes_at_one.update(ones)
        floating = [
            od for od in verdict.diffs if isinstance(od.ref, torch.Tensor) and od.ref.is_floating_point()
        ]
        flat = [od.name for od in floating if is_degenerate(od.ref)]
        self.stats.degenerate_outputs.update(flat)
        # a bound as wide as the output itself checks little there (a new user's one-pass variance
        # over features offset by 1,000 passed with an allowed error of 141 on values of +-1)
        self.stats.wide_bound_outputs.update(od.name for od in floating if od.name not in flat and _wide(od))
        self.stats.degenerate_at_one.update((name, k) for name in flat for k in ones)
        if floating and len(flat) == len(floating):
            self.stats.degenerate_passes += 1
        # every output a tensor and empty (a scalar output was compared)
        if verdict.diffs and all(
            isinstance(od.ref, torch.Tensor) and od.ref.numel() == 0 for od in verdict.diffs
        ):
            self.stats.empty_passes += 1

    def check_drawn(self, case: Case) -> None:
        """A case the run's own strategy drew lies within the bounds that strategy declares: a
        ``.map`` or :func:`~shardfuzz.strategies.bounded_like` that moves a size past them (a new
        user's GQA rounding drew ``q_per_kv=6`` against ``Free(1, 4)``) made findings whose failure
        files ``replay`` and ``shardfuzz case`` then refused as cases the target never draws."""
        if self._declared is None:
            self._declared = self.target.case_bounds(self.world_sizes()) or ()
        if not self._declared or any(b.problem(case) is None for b in self._declared):
            return
        try:  # names what lies outside, and admits a campaign's 1-rank retry of a larger world
            check_in_bounds(self.target, case)
        except InvalidArgument as e:
            raise TargetError(
                f"Target {self.target.name!r}: its strategy drew a case outside the bounds it declares "
                f"({str(e).split('never draws this case: ', 1)[-1]}), so a finding on it could not be "
                "replayed. A .map or sst.bounded_like that changes a size must keep it within the "
                f"bounds of the strategy it wraps: widen those bounds (Free(max_size=...), "
                f"Split(max_per_rank=...)) or clamp the size in the map. The case: {case!r}"
            ) from None

    def _check_case(self, case: Case) -> None:
        """``case`` is a Case of this runner's target at a world size shardfuzz runs."""
        if not isinstance(case, Case):
            raise InvalidArgument(f"case={case!r}; expected a shardfuzz.Case")
        if case.target != self.target.name:
            raise InvalidArgument(
                f"case.target={case.target!r} but this runner fuzzes {self.target.name!r} (each case names "
                f"its target: a target's own cases= draws with its name, sst.cases({self.target.name!r}, "
                "...), a derived target's too)"
            )
        check_world_size(case.world_size, "case world_size")
        check_dtensor_inputs(self.target, case)

    def _admit(self, case: Case) -> None:
        """Raise if ``case`` is not to be run here: a placement the devices cannot take, a case the
        target does not support (Unsupported), or a known failure (Excluded, counted)."""
        check_placement(self.target, self.backend, self.device, case.world_size)
        if self.target.supports is not None:
            reason = supports(self.target, case)
            if reason:
                raise Unsupported(
                    f"target {self.target.name!r} does not support this case: {reason}", reason=reason
                )
        reason = exclusion(case, self.target, self.config.exclude, self.stats.exclude_lacked)
        if reason is not None:  # a known failure: counted and shown, never run
            self.stats.excluded[reason] += 1
            self.stats.excluded_triggers.update(triggers_of(self.target, case))
            raise Excluded(f"excluded as a known failure: {reason}", reason=reason)

    def _timeout_key(self, case: Case) -> tuple:
        return (self.target.name, case.world_size, self.backend, self.device)

    def _run_in_clean_driver(self, case: Case) -> tuple[float, float | None]:
        """:meth:`_run_on_pool`, the driver's environment and working directory restored after it."""
        self._driver_state.snapshot()
        try:
            return self._run_on_pool(case)
        finally:
            self.stats.leaks.update(self._driver_state.restore())

    def _raise_rank_failed(self, case: Case, outcome: RankFailed) -> NoReturn:
        """A rank's error as a finding; or, where the rank could not load the target or
        implementation the driver loaded (a file missing on another node), a setup error."""
        if outcome.error.exc_type == RankSetupError.__name__:
            last = outcome.error.traceback.rstrip().splitlines()[-1]
            raise RankSetupError(
                f"{last.removeprefix('shardfuzz.errors.RankSetupError: ')}\nEvery rank imports the "
                "target and implementation the driver names, by the same path: with rank servers on "
                "other nodes (--ranks), each node needs those files at that path and the same "
                "PYTHONPATH (docs/how-to/multi-node.md)"
            )
        self.reporter.raise_rank_error(case, outcome)

    def _run_on_pool(self, case: Case) -> tuple[float, float | None]:
        """Worst error/tolerance and the time taken (None: the first example of this target on a
        fresh pool, which pays imports and is not learnt from)."""
        window = TIMEOUTS.timeout(self._timeout_key(case), self.config.timeout)
        cap = hard_cap(window)
        pool = get_pool(
            self.backend,
            case.world_size,
            cap,
            device=self.device,
            debug=self.config.debug_collectives,
            world=self.rank_servers,
        )
        want_flags = self.numerics is None
        task = Task(
            case, self.worker_target, self.impl_ref, cap, self.config.deterministic, want_flags, self.trace
        )
        pool.submit(task)
        not_a_case: Unsupported | None = None
        try:
            try:
                expected = self.expected(case)  # overlaps with the ranks' work
            except Unsupported as e:  # not a case (an edge value overflowing the oracle): the
                not_a_case = e  # ranks finish it unread, and the pool stays warm
            outcome = pool.collect(window, cap)
            kept = regroup(pool, outcome)  # a rank's own error: the processes stay, with a new group
        except BaseException:  # the oracle raised, Ctrl-C, a deadline: the ranks may still be busy
            discard_pool(pool)
            raise
        leaks = self._note_leaks(outcome)
        if not kept and (not isinstance(outcome, Completed) or any(r.restart for r in outcome.replies)):
            discard_pool(pool, spare_for=task)  # fresh ranks next time, from a spare started now
        if not_a_case is not None:
            raise not_a_case
        if isinstance(outcome, RankFailed):  # (leaks: only a completed example reports them)
            self._raise_rank_failed(case, outcome)
        if isinstance(outcome, RankDied):  # confirmed on fresh ranks first: it may come from outside
            note = confirm_death(self, case, outcome)
            try:
                self.reporter.raise_rank_died(case, outcome)
            except Finding as f:
                if note:  # it recurs only sometimes
                    f.report += note
                    f.args = (f.report,)
                raise
        if isinstance(outcome, Hung):
            self.reporter.raise_hang(case, outcome)
        assert isinstance(outcome, Completed)
        first = self.worker_target not in pool.ran
        pool.ran.add(self.worker_target)
        unsupported = [rep for rep in outcome.replies if isinstance(rep, UnsupportedReply)]
        if unsupported:  # counted by reason; the message says more, for `shardfuzz case`
            refused = sorted({rep.reason for rep in unsupported})
            said = sorted({rep.message or rep.reason for rep in unsupported})
            raise Unsupported("; ".join(said), reason="; ".join(refused))
        replies = [rep for rep in outcome.replies if isinstance(rep, Reply)]
        if self.numerics is None:
            self.numerics = replies[0].numerics
        ratio = self.judge_replies(case, replies, expected, leaks)
        return ratio, None if first else outcome.elapsed

    def _note_leaks(self, outcome: Any) -> list[str]:
        if not isinstance(outcome, Completed):
            return []
        leaks = [leak for rep in outcome.replies for leak in rep.leaks]
        self.stats.leaks.update(leaks)
        return leaks

    # -- the oracle and the judge (public: the torchrun path uses them) ------------------------
    def expected(self, case: Case) -> Expected:
        """The oracle's values for ``case`` (remembers the inputs for failure files); noise samples
        come later, where the verdict needs them (:meth:`verdict`)."""
        if self.target.oracle == SELF:  # the implementation at world size 1, once the ranks answered
            window = TIMEOUTS.timeout(self._timeout_key(case), self.config.timeout)
            expected = self_expected(self.target, case, self.impl_ref, self.config, window)
        else:
            expected = evaluate_oracle(self.target, case)
        self.last_inputs = expected.inputs
        return expected

    def judge_replies(
        self, case: Case, replies: list[Reply], expected: Expected, leaks: Sequence[str] = ()
    ) -> float:
        """Judge every rank's :class:`Reply`; returns the worst error/tolerance or raises a Finding
        (whose report names the ``leaks``: global state the example left behind)."""
        verdict = self.verdict(case, replies, expected)
        self.last_verdict = verdict  # read by run_case for the statistics
        self.last_traces = traces = {r: rep.trace for r, rep in enumerate(replies)}
        self.reporter.raise_verdict(case, verdict, traces, leaks)
        over = over_budget(self.target, self.impl_name, case, traces)  # right values; now the bytes
        if over is not None:
            self.reporter.raise_communication(case, over[1], over[0], traces, leaks)
        return verdict.worst

    def verdict(self, case: Case, replies: list[Reply], expected: Expected) -> Verdict:
        """:func:`shardfuzz.verdict.decide.decide` with this run's target, tolerance and closest pass."""
        config = DecideConfig(
            self.target, self.tolerance, self.stats.worst_pass_ratio, self.always_noise, self.recheck
        )
        return decide(case, replies, expected, config)

    def finding_context(self, case: Case, finding: Finding) -> FindingContext:
        """The frozen context of ``finding``, raised by ``case`` (the example this runner just ran)."""
        return FindingContext(
            case=case,
            target=self.target.name,
            target_ref=self.target_spec,
            worker_ref=self.worker_target,
            impl=self.impl_name,
            impl_ref=self.impl_ref,
            backend=self.backend,
            device=self.device,
            config=self.config,
            tolerance=self.tolerance,
            inputs_sha256=inputs_hash(self.last_inputs),
            numerics=self.numerics,
            traces=dict(finding.traces),
            leaks=tuple(finding.leaks),
            planted=self.impl_name in self.target.planted,
        )


def rerun_flags(config: RunConfig) -> str:
    """The flags of a rerun line that say where and how the case ran: a backend and device other
    than the defaults, torchrun's rank servers (a multi-node finding reran on local ranks without
    them: docs/how-to/multi-node.md) and their secret file (a path, never the secret), and the
    run's own tolerances and fixed timeout (a hang found with --timeout 0.05 reran at the adaptive
    10 s)."""
    flags = "" if config.backend == "gloo" else f" --backend {config.backend}"
    if config.timeout is not None:
        flags += f" --timeout {config.timeout:g}"
    if config.device != default_device(config.backend):
        flags += f" --device {config.device}"
    if config.ranks is not None:
        flags += f" --ranks {_for_shell(config.ranks)}"
        if config.secret_file is not None:
            flags += f" --secret-file {_for_shell(config.secret_file)}"
    return flags + "".join(f" --tolerance {format_tolerance(n, t)}" for n, t in config.tolerance.per_output)


def _for_shell(arg: str) -> str:
    """``arg`` as is where a shell reads it so, else quoted (a bound implementation's ``(bug='x')``,
    a path with a space): the rerun line is pasted into a shell."""
    return arg if shlex.quote(arg) == arg else shell_quote(arg)


def _wide(od: Any) -> bool:
    """Whether ``od``'s allowed error was at least its oracle value at every element: an all-zero
    answer would have passed (a sure pass's bound, without the noise term, is the narrower one:
    never counted where the full bound would not be)."""
    ref, bound = od.ref, od.bound
    if not isinstance(bound, torch.Tensor) or ref.numel() == 0 or bound.shape != ref.shape:
        return False
    finite = torch.isfinite(ref)
    return bool(finite.any()) and bool((ref.abs() <= bound)[finite].all())
