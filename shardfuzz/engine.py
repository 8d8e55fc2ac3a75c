"""One example end to end, the Hypothesis test around it, and :func:`shardfuzz.run`.

Hypothesis runs only in the driver, with a single ``case`` argument; ranks never call ``@given``.
Each failure kind is raised from its own function below (Hypothesis tells bugs apart by exception
type *and* raise site).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import time
from collections.abc import Iterable
from typing import Any

from shardfuzz.case import Case
from shardfuzz.compare import OutputDiff, RankDiff, Tolerance, compare_tensor, exact_equal, format_output_diff
from shardfuzz.errors import (
    Finding,
    IgnoredCollective,
    InvalidArgument,
    LayoutMismatch,
    Mismatch,
    RankError,
    RankHang,
    ShardfuzzError,
    Unsupported,
)
from shardfuzz.target import Target

try:  # Python 3.11+; Hypothesis brings the backport on 3.10
    _EXCEPTION_GROUP: type | None = BaseExceptionGroup  # type: ignore[name-defined]
except NameError:  # pragma: no cover
    try:
        from exceptiongroup import BaseExceptionGroup as _EXCEPTION_GROUP
    except ImportError:
        _EXCEPTION_GROUP = None

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
TIMEOUT_BUCKETS = (2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1800)

_driver_ready = False


def _prepare_driver() -> None:
    """One OpenMP thread in the driver too: 2 cores, 4 ranks and a spinning driver is 6x slower."""
    global _driver_ready
    if not _driver_ready:
        import torch

        if "OMP_NUM_THREADS" not in os.environ or os.environ.get("SHARDFUZZ_DRIVER_THREADS"):
            torch.set_num_threads(int(os.environ.get("SHARDFUZZ_DRIVER_THREADS", "1")))
        _driver_ready = True


class TimeoutPolicy:
    """Example timeout per (target, world size): adaptive from recent passing examples, or fixed.

    Adaptive: ``max(floor, factor * slowest of the last 50 passing examples)``, ``initial`` before
    five examples have passed, rounded up to a bucket (2, 3, 5, 10, 20, 30, 60 s, ...) so that the
    ranks can cache one process group per timeout. The ranks' gloo groups use the same value, so a
    rank stuck in a collective raises after it; that is reported as a hang, like the driver's own
    timeout.
    """

    def __init__(self, floor: float = 5.0, initial: float = 30.0, factor: float = 20.0) -> None:
        self.floor, self.initial, self.factor = floor, initial, factor
        self.recent: dict[tuple, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=50)
        )

    def timeout(self, key: tuple, fixed: float | None = None) -> float:
        if fixed is not None:
            return float(fixed)
        seen = self.recent[key]
        value = self.initial if len(seen) < 5 else max(self.floor, self.factor * max(seen))
        return float(next((b for b in TIMEOUT_BUCKETS if b >= value), TIMEOUT_BUCKETS[-1]))

    def record(self, key: tuple, seconds: float) -> None:
        self.recent[key].append(seconds)


TIMEOUTS = TimeoutPolicy()


@dataclasses.dataclass
class Stats:
    """Counters for one fuzzing run."""

    examples: int = 0
    passed: int = 0
    failures: int = 0
    elapsed: float = 0.0
    #: how many examples ran until the first failure (None: no failure)
    first_failure_at: int | None = None
    #: smallest error/tolerance among mismatching examples (how clearly a bug is seen)
    margin: float | None = None
    #: largest error/tolerance among passing examples (how close a correct run came)
    worst_pass_ratio: float = 0.0
    triggers: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: failing examples by failure kind (shrinking included)
    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: cases the target rejected through its ``supports`` hook, by reason
    unsupported: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def per_second(self) -> float:
        return self.examples / self.elapsed if self.elapsed else 0.0

    def summary(self) -> str:
        trig = (
            ", ".join(
                f"{k} {100.0 * v / self.examples:.0f}%" for k, v in sorted(self.triggers.items()) if v > 0
            )
            if self.examples
            else ""
        )
        margin = f", margin {self.margin:.3g}x" if self.margin is not None else ""
        if self.unsupported:
            margin += "; rejected as unsupported: " + ", ".join(
                f"{k} x{v}" for k, v in self.unsupported.items()
            )
        return (
            f"{self.examples} examples in {self.elapsed:.1f} s ({self.per_second:.1f}/s), "
            f"{self.failures} failing{margin}; worst passing error/tolerance {self.worst_pass_ratio:.3g}"
            + (f"; reached: {trig}" if trig else "")
        )


class Runner:
    """Runs cases of one (target, implementation, backend) and checks them against the oracle."""

    def __init__(
        self,
        target: Any,
        impl: Any = None,
        *,
        backend: str = "gloo",
        timeout: float | None = None,
        world_sizes: Iterable[int] | None = None,
        tolerance: Tolerance | None = None,
        target_spec: str | None = None,
        device: str | None = None,
        debug_collectives: bool = False,
        deterministic: bool = False,
    ) -> None:
        from shardfuzz.registry import get_target

        if backend not in BACKENDS:
            raise InvalidArgument(f"backend={backend!r}; allowed: {', '.join(BACKENDS)}")
        device = device or ("cuda" if backend == "nccl" else "cpu")
        if device not in DEVICES:
            raise InvalidArgument(f"device={device!r}; allowed: {', '.join(DEVICES)}")
        if backend == "nccl" and device != "cuda":
            raise InvalidArgument(f"device={device!r} with backend='nccl'; nccl needs device='cuda'")
        self.device = device
        self.debug_collectives = debug_collectives
        self.deterministic = deterministic
        #: called as on_failure(runner, case, finding) for every finding (failure files use it)
        self.on_failure = None
        #: numerics flags reported by rank 0 of the first example
        self.numerics: dict[str, Any] | None = None
        #: the full inputs of the last case the oracle ran (failure files hash them)
        self.last_inputs: dict[str, Any] = {}
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise InvalidArgument(f"timeout={timeout!r}; must be a number of seconds > 0")
        self.target: Target = get_target(target)
        self.target_spec = target_spec or (target if isinstance(target, str) else self.target.name)
        self.impl_ref = self.target.impl_ref(impl)
        self.impl_name = self.target.impl_name(impl)
        self.backend = backend
        self.fixed_timeout = timeout
        if world_sizes is not None:
            world_sizes = tuple(world_sizes)
            bad = [w for w in world_sizes if not isinstance(w, int) or w < 1]
            if not world_sizes or bad:
                raise InvalidArgument(f"world_sizes={world_sizes!r}; must be a non-empty list of ints >= 1")
        self.world_sizes = world_sizes
        self.tolerance = tolerance or Tolerance()
        self.stats = Stats()
        self.worker_target = self.target.worker_ref()

    # -- strategy / naming ----------------------------------------------------------------
    def strategy(self):
        return self.target.strategy(self.world_sizes)

    @property
    def key(self) -> str:
        return f"{self.target.name}/{self.impl_name}/{self.backend}"

    def rerun_command(self, case: Case) -> str:
        impl = self.impl_name if self.impl_name in self.target.implementations else self.impl_ref
        backend = "" if self.backend == "gloo" else f" --backend {self.backend}"
        return f"shardfuzz case {self.target_spec} --impl {impl}{backend} {_shell_quote(repr(case))}"

    # -- one example ----------------------------------------------------------------------
    def check(self, case: Case) -> float:
        """Run one case inside a Hypothesis test: statistics, events and ``target()`` included."""
        from hypothesis import event, reject, target

        from shardfuzz.strategies import triggers_of

        reached = triggers_of(case)
        if any(name.startswith("grad") for name in self.target.outputs):
            reached.add("backward")
        self.stats.triggers.update(reached)
        try:
            ratio = self.run_case(case)
        except Unsupported as e:
            self.stats.triggers.subtract(reached)
            self.stats.unsupported[str(e).rpartition(": ")[2] or str(e)] += 1
            event(f"unsupported: {e}")
            reject()
        for t in reached:
            event(t)
        target(min(ratio, 1.0), label="error/tolerance")
        return ratio

    def run_case(self, case: Case) -> float:
        """Run one case on the ranks and compare. Returns the worst error/tolerance; raises a Finding."""
        from shardfuzz.pool import discard_pool, get_pool

        _prepare_driver()
        if not isinstance(case, Case):
            raise InvalidArgument(f"case={case!r}; expected a shardfuzz.Case")
        if case.target != self.target.name:
            raise InvalidArgument(f"case.target={case.target!r} but this runner fuzzes {self.target.name!r}")
        self._check_backend(case)
        if self.target.supports is not None:
            reason = self.target.supports(case)
            if reason:
                raise Unsupported(f"target {self.target.name!r} does not support this case: {reason}")
        self.stats.examples += 1
        tkey = (self.target.name, case.world_size, self.backend, self.device)
        timeout = TIMEOUTS.timeout(tkey, self.fixed_timeout)
        pool = get_pool(
            self.backend, case.world_size, timeout, device=self.device, debug=self.debug_collectives
        )
        pool.submit(
            {
                "case": case,
                "target": self.worker_target,
                "impl": self.impl_ref,
                "timeout": timeout,
                "deterministic": self.deterministic,
                "want_flags": self.numerics is None,
            }
        )
        try:
            expected = self._oracle(case)  # overlaps with the ranks' work
        except BaseException:
            pool.collect(timeout)
            raise
        outcome = pool.collect(timeout + 1.0)
        try:
            if outcome.status == "error":
                discard_pool(pool)
                self._raise_rank_error(case, outcome)
            if outcome.status == "dead":
                discard_pool(pool)
                self._raise_rank_died(case, outcome)
            if outcome.status == "hang":
                discard_pool(pool)
                self._raise_hang(case, outcome, timeout)
            skipped = sorted({rep[1] for rep in outcome.replies if rep[0] == "unsupported"})
            if skipped:
                self.stats.examples -= 1
                raise Unsupported("; ".join(skipped))
            if self.numerics is None:
                self.numerics = outcome.replies[0][2].get("numerics")
            ratio = self.judge(case, [rep[1:] for rep in outcome.replies], expected)
        except Finding as f:
            self.stats.failures += 1
            self.stats.kinds[f.kind] += 1
            if self.stats.first_failure_at is None:
                self.stats.first_failure_at = self.stats.examples
            if self.on_failure is not None:
                self.on_failure(self, case, f)
            raise
        self.stats.passed += 1
        self.stats.worst_pass_ratio = max(self.stats.worst_pass_ratio, ratio)
        TIMEOUTS.record(tkey, outcome.elapsed)
        return ratio

    def judge(self, case: Case, replies: list[tuple], expected: dict[str, Any]) -> float:
        """Check the ranks' replies ``(encoded outputs, info)`` against the oracle's ``expected``.

        Used by :meth:`run_case` and by the torchrun path (:mod:`shardfuzz.torchrun`), where rank 0
        gathers the replies through a separate CPU group.
        """
        from shardfuzz.worker import decode

        locals_ = [decode(rep[0]) for rep in replies]
        ignored = {
            r: rep[1]["ignored_collective"] for r, rep in enumerate(replies) if rep[1]["ignored_collective"]
        }
        if ignored:
            self._raise_ignored_collective(case, ignored)
        self._check_layouts(case, locals_, expected)
        return self._compare(case, locals_, expected)

    def _check_backend(self, case: Case) -> None:
        from shardfuzz.gpu import check_placement

        check_placement(self.target, self.backend, self.device, case.world_size)

    # -- the oracle -----------------------------------------------------------------------
    def _oracle(self, case: Case) -> dict[str, Any]:
        import torch

        torch.manual_seed(case.seed)
        inputs = self.target.inputs(case)
        self.last_inputs = inputs
        if not isinstance(inputs, dict):
            raise ShardfuzzError(
                f"target {self.target.name!r}: inputs(case) returned {type(inputs).__name__}, not a dict"
            )
        inputs64 = {
            k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in inputs.items()
        }
        with torch.enable_grad():
            ref = self.target.oracle(inputs64, case)
            low = self.target.oracle(
                {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}, case
            )
            mag = self.target.magnitude(inputs64, case) if self.target.magnitude else {}
        missing = set(self.target.outputs) - set(ref)
        if missing:
            raise ShardfuzzError(f"target {self.target.name!r}: the oracle returned no {sorted(missing)}")
        detach = lambda d: {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
        return {"ref": detach(ref), "low": detach(low), "mag": detach(mag)}

    # -- checks ---------------------------------------------------------------------------
    def _replicas(self, case: Case) -> list[list[int]]:
        g = case.group_size
        return [list(range(i * g, (i + 1) * g)) for i in range(case.replicas)]

    def _rank_label(self, case: Case, rank: int) -> str:
        if len(case.mesh) == 1:
            return f"rank {rank}"
        g = case.group_size
        return f"rank {rank} (replica {rank // g}, group rank {rank % g})"

    def _check_layouts(self, case: Case, locals_: list[dict], expected: dict) -> None:
        import torch

        problems = []
        declared = set(self.target.outputs)
        for r, out in enumerate(locals_):
            if set(out) != declared:
                problems.append(
                    f"{self._rank_label(case, r)} returned outputs {sorted(out)}; the target declares {sorted(declared)}"
                )
        if problems:
            self._raise_layout(case, problems)
        g = case.group_size
        for name, layout in self.target.outputs.items():
            ref, low = expected["ref"][name], expected["low"][name]
            for r, out in enumerate(locals_):
                got = out[name]
                if not isinstance(ref, torch.Tensor):
                    if isinstance(got, torch.Tensor):
                        problems.append(
                            f"output {name!r}: {self._rank_label(case, r)} returned a tensor, expected {type(ref).__name__}"
                        )
                    continue
                if not isinstance(got, torch.Tensor):
                    problems.append(
                        f"output {name!r}: {self._rank_label(case, r)} returned {type(got).__name__}, expected a tensor"
                    )
                    continue
                want_shape = layout.expected_shape(tuple(got.shape), tuple(ref.shape), r % g, g)
                if tuple(got.shape) != want_shape or got.dtype != low.dtype:
                    problems.append(
                        f"output {name!r} ({layout!r}): {self._rank_label(case, r)} holds "
                        f"{list(got.shape)} {str(got.dtype).removeprefix('torch.')}, expected "
                        f"{list(want_shape)} {str(low.dtype).removeprefix('torch.')} "
                        f"(global {list(ref.shape)} over {g} ranks)"
                    )
            if isinstance(ref, torch.Tensor):
                for replica in self._replicas(case):
                    msg = layout.check_group(
                        [tuple(locals_[r][name].shape) for r in replica], tuple(ref.shape)
                    )
                    if msg:
                        problems.append(f"output {name!r} ({layout!r}), ranks {replica}: {msg}")
        if problems:
            self._raise_layout(case, problems)

    def _compare(self, case: Case, locals_: list[dict], expected: dict) -> float:
        import torch

        g = case.group_size
        diffs: list[OutputDiff] = []
        worst = 0.0
        for name, layout in self.target.outputs.items():
            ref, low, mag = expected["ref"][name], expected["low"][name], expected["mag"].get(name)
            if not isinstance(ref, torch.Tensor) or not (ref.is_floating_point() or ref.is_complex()):
                rds = []
                for r, out in enumerate(locals_):
                    if not _holds_piece(layout, out[name], ref):
                        continue
                    want = (
                        layout.piece(ref, r % g, g)
                        if isinstance(ref, torch.Tensor) and layout.per_rank
                        else ref
                    )
                    if layout.per_rank:
                        ok = exact_equal(out[name], want)
                        rds.append(
                            RankDiff(
                                r,
                                1,
                                0 if ok else 1,
                                max_ratio=0.0 if ok else float("inf"),
                                note="" if ok else f": got {_short(out[name])}, expected {_short(want)}",
                            )
                        )
                if not layout.per_rank:
                    for replica in self._replicas(case):
                        total = layout.assemble([locals_[r][name] for r in replica])
                        ok = exact_equal(total.to(ref.dtype), ref)
                        rds.append(
                            RankDiff(
                                None,
                                1,
                                0 if ok else 1,
                                max_ratio=0.0 if ok else float("inf"),
                                note="" if ok else f": sum {_short(total)}, expected {_short(ref)}",
                            )
                        )
                od = OutputDiff(name, repr(layout), _dtype_name(ref), tuple(getattr(ref, "shape", ())), rds)
            else:
                bound = self.tolerance.bound(ref, low, mag, case.dtype, g)
                rds = []
                if layout.per_rank:
                    for r, out in enumerate(locals_):
                        if not _holds_piece(layout, out[name], ref):
                            continue
                        want = layout.piece(ref, r % g, g)
                        b = layout.piece(bound, r % g, g)
                        got = layout.comparable(out[name], r % g, g, tuple(ref.shape))
                        rds.append(
                            compare_tensor(
                                got,
                                want,
                                b,
                                r,
                                lambda idx, r=r, layout=layout, shape=tuple(ref.shape): layout.global_index(
                                    idx, r % g, g, shape
                                ),
                            )
                        )
                else:
                    for replica in self._replicas(case):
                        total = layout.assemble([locals_[r][name] for r in replica])
                        rd = compare_tensor(total, ref, bound, None, lambda idx: idx)
                        rds.append(rd)
                od = OutputDiff(name, repr(layout), _dtype_name(low), tuple(ref.shape), rds)
            diffs.append(od)
            worst = max(worst, od.max_ratio)
        bad = [d for d in diffs if d.bad]
        if bad:
            self._raise_mismatch(case, diffs, worst)
        return worst

    # -- raise sites, one per failure kind ------------------------------------------------
    def _header(self, what: str, case: Case) -> str:
        return (
            f"shardfuzz: {what}\n"
            f"target {self.target.name!r}, implementation {self.impl_name!r} ({self.impl_ref}), backend {self.backend}\n"
            f"{case!r}"
        )

    def _footer(self, case: Case) -> str:
        return f"Rerun this case: {self.rerun_command(case)}"

    def _raise_mismatch(self, case: Case, diffs: list[OutputDiff], worst: float) -> None:
        bad = [d for d in diffs if d.bad]
        ratio = worst  # this example's largest error/tolerance; the margin is the min over examples
        self.stats.margin = ratio if self.stats.margin is None else min(self.stats.margin, ratio)
        parts = [self._header(f"{len(bad)} of {len(diffs)} outputs mismatch the oracle", case)]
        parts.append(f"tolerance: {self.tolerance.describe()}")
        label = lambda r: self._rank_label(case, r)
        parts += [format_output_diff(d, label) for d in bad]
        ok = [f"{d.name} (worst {d.max_ratio:.3g})" for d in diffs if not d.bad and sum(r.n for r in d.ranks)]
        if ok:
            parts.append("outputs within tolerance: " + ", ".join(ok))
        parts.append(self._footer(case))
        err = Mismatch("\n".join(parts), case=case, ratio=ratio)
        err.outputs = {d.name: sorted(r.rank for r in d.ranks if r.bad and r.rank is not None) for d in bad}
        raise err

    def _raise_layout(self, case: Case, problems: list[str]) -> None:
        parts = [self._header("local shapes/dtypes do not match the output layouts", case)]
        parts += [f"  {p}" for p in problems]
        parts.append(self._footer(case))
        raise LayoutMismatch("\n".join(parts), case=case)

    def _raise_rank_error(self, case: Case, outcome) -> None:
        parts = [self._header(f"rank {outcome.rank} raised an exception", case)]
        parts.append(
            f"Rank {outcome.rank} terminated with the following error:\n{outcome.traceback.rstrip()}"
        )
        parts += [t for t in outcome.output.values() if t]
        parts.append(self._footer(case))
        raise RankError("\n".join(parts), case=case)

    def _raise_rank_died(self, case: Case, outcome) -> None:
        parts = [self._header(f"rank {outcome.rank} died (exit code {outcome.exitcode})", case)]
        parts += [t for t in outcome.output.values() if t]
        parts.append(self._footer(case))
        raise RankError("\n".join(parts), case=case)

    def _raise_hang(self, case: Case, outcome, timeout: float) -> None:
        parts = [
            self._header(
                f"the example hung: no result within {timeout:g} s (gloo timeout {timeout:g} s)", case
            )
        ]
        if outcome.traceback:
            parts.append("Collectives that timed out inside ranks:\n" + outcome.traceback.rstrip())
        for r, stack in sorted(outcome.stacks.items()):
            parts.append(f"--- rank {r} stack ---\n{stack.rstrip()}")
        parts += [t for t in outcome.output.values() if t]
        parts.append(self._footer(case))
        raise RankHang("\n".join(parts), case=case)

    def _raise_ignored_collective(self, case: Case, ignored: dict[int, list[str]]) -> None:
        parts = [
            self._header(
                "autograd went through a collective with no autograd kernel (treated as identity)", case
            )
        ]
        for r, msgs in sorted(ignored.items()):
            parts.append(f"  {self._rank_label(case, r)}: {msgs[0].splitlines()[0][:300]}")
        parts.append(
            "  Wrap the collective in an autograd Function (Megatron's f/g pair) or use "
            "torch.distributed.nn.functional; see pytorch/pytorch#152127."
        )
        parts.append(self._footer(case))
        raise IgnoredCollective("\n".join(parts), case=case)


def _holds_piece(layout: Any, local: Any, ref: Any) -> bool:
    """Whether a rank's local holds something to compare (not so for a non-owner of ``Owned()``)."""
    return layout.holds_piece(tuple(getattr(local, "shape", ())), tuple(getattr(ref, "shape", ())))


def _dtype_name(v: Any) -> str:
    return str(getattr(v, "dtype", type(v).__name__)).removeprefix("torch.")


def _short(v: Any) -> str:
    text = repr(v.tolist()) if hasattr(v, "tolist") else repr(v)
    return text if len(text) < 120 else text[:117] + "..."


def _shell_quote(s: str) -> str:
    if not any(c in s for c in '"$`\\!'):
        return f'"{s}"'
    import shlex

    return shlex.quote(s)


# -- Hypothesis -------------------------------------------------------------------------------
def stable_seed(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def build_test(runner: Runner, settings=None, *, database: Any = "default"):
    """The ``@given`` test for a runner: one ``case`` argument, settings built now, and a database
    keyed by target/implementation/backend."""
    from hypothesis import given, seed

    from shardfuzz.database import keyed_database
    from shardfuzz.settings import build_settings

    s = settings if settings is not None else build_settings()
    if database != "default":
        s = type(s)(s, database=database)
    if s.database is not None:
        s = type(s)(s, database=keyed_database(s.database, runner.key))

    def test_case(case: Case) -> None:
        runner.check(case)

    ident = "".join(c if c.isalnum() else "_" for c in runner.key)
    test_case.__name__ = test_case.__qualname__ = f"shardfuzz_{ident}"
    test = given(case=runner.strategy())(test_case)
    test = s(test)
    if s.derandomize:
        test = seed(stable_seed(runner.key))(test)
    return test


@dataclasses.dataclass
class Result:
    """What :func:`run` found."""

    target: str
    impl: str
    backend: str
    found: bool
    kind: str | None = None
    case: Case | None = None
    report: str = ""
    failures: list[Finding] = dataclasses.field(default_factory=list)
    stats: Stats = dataclasses.field(default_factory=Stats)
    flaky: bool = False

    def __bool__(self) -> bool:  # truthy when something was found
        return self.found


def _findings_of(exc: BaseException) -> list[Finding]:
    if isinstance(exc, Finding):
        return [exc]
    if _EXCEPTION_GROUP is not None and isinstance(exc, _EXCEPTION_GROUP):
        out = []
        for e in exc.exceptions:
            out += _findings_of(e)
        return out
    return []


def run(
    target: Any,
    impl: Any = None,
    *,
    backend: str = "gloo",
    max_examples: int | None = None,
    profile: str | None = None,
    world_sizes: Iterable[int] | None = None,
    timeout: float | None = None,
    tolerance: Tolerance | None = None,
    database: Any = "default",
    settings: Any = None,
    runner: Runner | None = None,
    derandomize: bool | None = None,
    failures_dir: str | None = None,
    device: str | None = None,
    deterministic: bool = False,
) -> Result:
    """Fuzz one implementation of a target; return a :class:`Result` (it does not raise on findings).

    Args:
        target: a :class:`Target`, a target name, ``pkg.mod:ATTR`` or a ``file.py`` path.
        impl: an implementation name, ``pkg.mod:func``, ``file.py::NAME`` or a module-level function
            (default: the target's reference).
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        max_examples: Hypothesis' example budget (default: the profile's).
        profile: ``shardfuzz-ci``, ``shardfuzz-dev`` or ``shardfuzz-fuzz`` (default: picked from the
            current Hypothesis profile).
        world_sizes: restrict the world sizes drawn.
        timeout: fixed example timeout in seconds (default: adaptive).
        database: a Hypothesis database, ``None`` for none, or ``"default"`` for the profile's.
        derandomize: override the profile's ``derandomize`` (campaigns use fresh seeds).
        failures_dir: write a failure file there as soon as a failure is seen, and update it while
            Hypothesis shrinks (default: none from Python; the CLI and pytest write to
            ``.shardfuzz/failures``).
        device: ``"cpu"`` or ``"cuda"`` (default: cuda for nccl, cpu for gloo).
        deterministic: run the ranks with ``torch.use_deterministic_algorithms(True)``.
    """
    from hypothesis.errors import Flaky

    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise InvalidArgument(f"max_examples={max_examples!r}; must be an int >= 1")
    runner = runner or Runner(
        target,
        impl,
        backend=backend,
        timeout=timeout,
        world_sizes=world_sizes,
        tolerance=tolerance,
        device=device,
        deterministic=deterministic,
    )
    if failures_dir is not None:
        from shardfuzz.failures import FailureRecorder

        runner.on_failure = FailureRecorder(failures_dir)
    from hypothesis import Verbosity

    from shardfuzz.settings import build_settings

    s = (
        settings
        if settings is not None
        else build_settings(
            profile, max_examples=max_examples, verbosity=Verbosity.quiet, derandomize=derandomize
        )
    )
    test = build_test(runner, s, database=database)
    result = Result(runner.target.name, runner.impl_name, runner.backend, found=False, stats=runner.stats)
    t0 = time.perf_counter()
    try:
        test()
    except BaseException as exc:
        findings = _findings_of(exc)
        if not findings:
            raise
        result.found = True
        result.flaky = isinstance(exc, Flaky)
        result.failures = findings
        first = findings[0]
        result.kind, result.case, result.report = first.kind, first.case, first.report
        if result.flaky:
            result.report = (
                "Hypothesis reports this failure as flaky (it did not reproduce):\n" + result.report
            )
    finally:
        runner.stats.elapsed += time.perf_counter() - t0
    return result
