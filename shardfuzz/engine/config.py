"""One run configuration, validated in one place.

The CLI, the pytest plugin, :func:`shardfuzz.run`, campaigns and child jobs all build a
:class:`RunConfig` and pass it on; child jobs get it serialised (:meth:`RunConfig.to_json`), never
re-created from argv.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from shardfuzz.case import DTYPES
from shardfuzz.engine.shared_db import check_database, check_fleet, env_database, env_fleet
from shardfuzz.errors import InvalidArgument

# the limits moved to the core module shardfuzz.limits; re-exported for RunConfig's callers
from shardfuzz.limits import BACKENDS as BACKENDS
from shardfuzz.limits import DEVICES as DEVICES
from shardfuzz.limits import ENV_INTS as ENV_INTS
from shardfuzz.limits import check_environment as check_environment
from shardfuzz.limits import check_world_size as check_world_size
from shardfuzz.limits import default_device as default_device
from shardfuzz.limits import env_int as env_int
from shardfuzz.limits import max_world_size as max_world_size
from shardfuzz.spec.exclude import CaseExpression
from shardfuzz.spec.tolerance import OutputTolerance, Tolerance
from shardfuzz.spec.triggers import conditions_named

PROFILES = ("shardfuzz-ci", "shardfuzz-dev", "shardfuzz-fuzz")


def run_origin() -> dict[str, str]:
    """The pytest test and the pytest-xdist worker (``gw0``, ``gw1``...) this process runs, from
    ``$PYTEST_CURRENT_TEST`` and ``$PYTEST_XDIST_WORKER``: failure files name them (empty outside)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return {k: v for k, v in (("pytest_test", test), ("xdist_worker", worker)) if v}


def bind_address(text: Any, name: str = "ranks") -> tuple[str, int]:
    """Where the driver listens for rank servers: ``HOST:PORT``, or ``PORT`` on the loopback
    interface (the default: only servers on this machine can reach it)."""
    host, sep, port = str(text).rpartition(":") if isinstance(text, str) else ("", "", "")
    host = host.strip("[]") if sep else "127.0.0.1"
    if not isinstance(text, str) or not port.isdigit() or not 0 <= int(port) < 65536 or (sep and not host):
        raise InvalidArgument(
            f"{name}={text!r}; expected HOST:PORT or PORT (on 127.0.0.1), e.g. 0.0.0.0:29600"
        )
    return host, int(port)


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``; ValueError for anything but comma-separated integers >= 1."""
    try:
        sizes = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"{text!r}; expected comma-separated integers >= 1, e.g. 1,2,3")
    return sizes


def parse_dtypes(text: str) -> tuple[str, ...]:
    """``"float32,bfloat16"`` -> ``("float32", "bfloat16")``; ValueError for anything but
    comma-separated names from :data:`~shardfuzz.case.DTYPES`."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [n for n in names if n not in DTYPES]
    if not names or bad:
        what = f"{bad[0]!r} is not a dtype" if bad else "no dtype given"
        raise ValueError(f"{text!r}: {what}; expected comma-separated dtypes from {', '.join(DTYPES)}")
    return names


TOLERANCE_SYNTAX = "expected OUTPUT=rtol:X,atol:Y (either part may be left out), e.g. y=rtol:1e-3,atol:1e-5"


def parse_tolerance(text: str) -> tuple[str, OutputTolerance]:
    """``"y=rtol:1e-3,atol:1e-5"`` -> ``("y", OutputTolerance(1e-3, 1e-5))``; ValueError naming the
    value, what is wrong and what is allowed."""
    name, sep, spec = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"{text!r}: no OUTPUT= before the tolerance; {TOLERANCE_SYNTAX}")
    try:
        return name.strip(), OutputTolerance.parse(spec)
    except ValueError as e:
        detail = str(e)
        if detail.startswith(repr(spec)):  # OutputTolerance.parse names the part after '='
            detail = detail[len(repr(spec)) :].lstrip(":; ")
        if detail.startswith("expected"):
            detail = f"{spec!r} is not rtol:X,atol:Y"
        raise ValueError(f"{text!r}: {detail}; {TOLERANCE_SYNTAX}") from None


def format_tolerance(name: str, tol: OutputTolerance) -> str:
    """The command-line form of one per-output tolerance (what :func:`parse_tolerance` reads)."""
    return f"{name}=rtol:{tol.rtol!r},atol:{tol.atol!r}"


def as_tolerance(value: Any, where: str = "tolerance") -> Tolerance:
    """A :class:`Tolerance` as is; a mapping output name -> ``OutputTolerance`` / ``{"rtol": X,
    "atol": Y}`` / ``(rtol, atol)`` as per-output overrides on the default Tolerance; anything else
    an InvalidArgument naming ``where``."""
    if isinstance(value, Tolerance):
        return value
    allowed = "shardfuzz.OutputTolerance(rtol=..., atol=...), {'rtol': X, 'atol': Y} or (rtol, atol)"
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            f"{where}={value!r}; must be a shardfuzz.Tolerance, or a mapping of output names to {allowed}"
        )
    for name, tol in value.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{where}={value!r}; its keys must be output names, got {name!r}")
        try:
            if isinstance(tol, Mapping):
                OutputTolerance(**tol)
            elif isinstance(tol, (tuple, list)) and len(tol) == 2:
                OutputTolerance(*tol)
            elif not isinstance(tol, OutputTolerance):
                raise InvalidArgument(f"a {type(tol).__name__}")
        except TypeError:
            raise InvalidArgument(f"{where}[{name!r}]={tol!r}: the keys are rtol and atol") from None
        except InvalidArgument as e:
            raise InvalidArgument(f"{where}[{name!r}]={tol!r}: {e}; expected {allowed}") from None
    return Tolerance().with_overrides(value)


def check_tolerance_outputs(targets: Iterable[Any], tolerance: Tolerance, where: str) -> None:
    """InvalidArgument for a per-output tolerance that names no output of any of ``targets`` (the
    targets of one command: a name may be meant for one of them). A target whose outputs depend on
    the case (``outputs=callable``) could have any output, so nothing is checked against it."""
    check_tolerance_names(declared_outputs(targets), tolerance, where)


def world_sizes_form(world_sizes: Any) -> tuple[int, ...]:
    """``world_sizes`` as a tuple, checked for its form only (a non-empty list of ints >= 1), not
    against this machine's limit (:func:`check_world_size`): a test file's ``test_for`` is checked
    when it is collected, and a suite written for a larger machine must still collect here."""
    sizes = tuple(world_sizes) if isinstance(world_sizes, Iterable) else ()
    if not sizes or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in sizes):
        raise InvalidArgument(f"world_sizes={world_sizes!r}; must be a non-empty list of ints >= 1")
    return sizes


def check_exclude_triggers(targets: list[Any], exclude: list[str], where: str) -> None:
    """InvalidArgument for an exclusion that tests a trigger condition (``'uneven' in triggers``) that
    no case of any of ``targets`` can reach: misspelt, it would exclude nothing."""
    named = {c for t in targets for c in conditions_named(t)}
    for text in exclude:
        for trigger in sorted(CaseExpression(text, where).triggers_read - named):
            declared = sorted(c for t in targets for c in t.triggers)
            raise InvalidArgument(
                f"{where}={text!r} tests {trigger!r} in triggers, which no case of "
                f"{', '.join(repr(t.name) for t in targets)} can reach (a misspelling?); the conditions are "
                f"named as progress lines and reports print them: the generic ones of docs/triggers.md "
                f"and the target's own ({', '.join(map(repr, declared)) or 'none'})"
            )


def check_exclude_keys(
    targets: Iterable[Any], exclude: Iterable[str], where: str, world_sizes: tuple[int, ...] | None = None
) -> None:
    """InvalidArgument for an exclusion that reads ``sizes[K]`` or ``options[K]`` where no case of any
    of ``targets`` (the targets of one command: an expression may be meant for one of them) can
    have ``K``: ``sizes['hedas'] > 1`` excluded nothing, and the run exited 0, with a line in the
    summary only. A target whose strategy declares nothing (:meth:`~shardfuzz.Target.case_bounds`)
    could draw any key, so nothing is checked then. ``world_sizes``: the run's (a strategy may
    declare other names at other world sizes)."""
    targets, exclude = list(targets), list(exclude)
    check_exclude_triggers(targets, exclude, where)
    declared: dict[str, dict[str, set[str]]] = {}
    for t in targets:
        bounds = t.case_bounds(world_sizes)
        if bounds is None:
            return
        declared[t.name] = {
            "sizes": {n for b in bounds for n, _ in b.sizes},
            "options": {o for b in bounds for o in b.option_names()},
        }
    for text in exclude:
        expression = CaseExpression(text, where)
        for kind, keys in expression.keys_read.items():
            for key in sorted(keys):
                if declared and not any(key in d[kind] for d in declared.values()):
                    names = {n: ", ".join(sorted(d[kind])) or "none" for n, d in declared.items()}
                    have = (
                        f"its {kind}: {next(iter(names.values()))}"
                        if len(names) == 1
                        else f"their {kind}: " + "; ".join(f"{n}: {v}" for n, v in names.items())
                    )
                    raise InvalidArgument(
                        f"{where}={text!r} reads {kind}[{key!r}], which no case of "
                        f"{'target' if len(names) == 1 else 'targets'} {', '.join(map(repr, declared))} "
                        f"has (a misspelling?); {have}"
                    )


def declared_outputs(targets: Iterable[Any]) -> dict[str, list[str] | None]:
    """Each target's output names (None: ``outputs=callable``, any name may be one), as plain data
    (pytest-xdist's workers send it to the controller)."""
    return {t.name: None if callable(t.outputs) else sorted(t.outputs) for t in targets}


def check_tolerance_names(declared: dict[str, list[str] | None], tolerance: Tolerance, where: str) -> None:
    """:func:`check_tolerance_outputs` on :func:`declared_outputs`."""
    known = {t: outs for t, outs in declared.items() if outs is not None}
    if len(known) < len(declared):  # a target whose outputs depend on the case: any name may be one
        return
    for name, _ in tolerance.per_output:
        if known and not any(
            name in outs or any(fnmatchcase(o, name) for o in outs) for outs in known.values()
        ):
            if len(known) == 1:
                tname, outs = next(iter(known.items()))
                raise InvalidArgument(
                    f"{where} names output {name!r}, which target {tname!r} does not have; its outputs are {outs}"
                )
            have = "; ".join(f"{t}: {outs}" for t, outs in known.items())
            raise InvalidArgument(
                f"{where} names output {name!r}, which none of the targets has; outputs: {have}"
            )


#: the largest fixed per-example timeout, in seconds
MAX_TIMEOUT = 86400.0


def _positive(name: str, value: Any, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, kinds) or not (value > 0 and math.isfinite(value)):
        what = "an int >= 1" if integer else "a finite number > 0"
        raise InvalidArgument(f"{name}={value!r}; must be {what}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How to run a target: where, with which limits, and what to draw.

    Attributes:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        device: ``"cpu"`` or ``"cuda"``; ``None`` picks cuda for nccl, cpu for gloo.
        world_sizes: restrict the world sizes drawn (``None``: the target's own).
        timeout: fixed example timeout in seconds (``None``: adaptive).
        tolerance: the tolerance policy; or a mapping output name -> ``OutputTolerance`` /
            ``{"rtol": X, "atol": Y}`` / ``(rtol, atol)``: per-output overrides on the default one.
        dtypes: restrict the dtypes drawn (``None``: the target's own).
        profile: ``shardfuzz-ci``, ``-dev`` or ``-fuzz`` (``None``: picked from the current
            Hypothesis profile when the test is built).
        max_examples: Hypothesis' example budget (``None``: the profile's).
        derandomize: override the profile's ``derandomize`` (campaigns use fresh seeds).
        deadline: wall-clock seconds for the whole search (``None``: no limit).
        finish_shrink: extra seconds after a campaign's deadline to finish shrinks it cut
            (:mod:`shardfuzz.engine.finish`; ``0``: none; ``None``: a quarter of the deadline, at most 120 s).
        stop_at_first: end a campaign (``shardfuzz fuzz --duration``, whose runs follow each other
            until the deadline) after the run that made its first finding, shrunk and saved; with
            ``--workers``, that worker's siblings stop too (a CI job that needs one failure, not all).
        failures_dir: write failure files there (``None``: none from Python; the CLI and pytest
            pass ``.shardfuzz/failures``).
        deterministic: ``torch.use_deterministic_algorithms(True)`` on every rank.
        debug_collectives: ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` in the ranks (replays only: slow).
        exclude: case expressions (``"options['smoothing'] > 0"``) of known failures to set aside:
            a matching case is counted as excluded, never run (see :mod:`shardfuzz.spec.exclude`).
        options: target options pinned to a value (``{"lse_grad": False}``): every drawn case
            gets it, as a contract choice for an implementation that supports only it.
        database: where examples are kept: a directory, or a ``redis://HOST:PORT/N`` URL shared by
            a fleet of workers (:mod:`shardfuzz.engine.shared_db`); ``None``: ``$SHARDFUZZ_DATABASE``, else
            the profile's own.
        fleet: the fleet's name on a shared Redis (its key prefix); ``None``: ``$SHARDFUZZ_FLEET``,
            else ``default``.
        ranks: ``HOST:PORT`` (or ``PORT``: on 127.0.0.1) where the driver listens for rank servers
            that torchrun started (``python -m shardfuzz.ranks.serve --driver HOST:PORT``); every
            case then runs on the first ``world_size`` ranks of their world, and world sizes are
            drawn up to its size. ``None``: local rank processes.
        secret_file: the file holding the secret the rank servers must prove (readable by its owner
            only); ``None``: ``$SHARDFUZZ_SECRET``.
    """

    backend: str = "gloo"
    device: str | None = None
    world_sizes: tuple[int, ...] | None = None
    timeout: float | None = None
    tolerance: Tolerance = dataclasses.field(default_factory=Tolerance)
    dtypes: tuple[str, ...] | None = None
    profile: str | None = None
    max_examples: int | None = None
    derandomize: bool | None = None
    deadline: float | None = None
    finish_shrink: float | None = None
    stop_at_first: bool = False
    failures_dir: str | None = None
    deterministic: bool = False
    debug_collectives: bool = False
    exclude: tuple[str, ...] = ()
    options: Any = ()  # Mapping[str, JSON value] in; sorted (name, value) pairs after
    database: str | None = None
    fleet: str | None = None
    ranks: str | None = None
    secret_file: str | None = None

    def __post_init__(self) -> None:
        check_environment()
        if self.backend not in BACKENDS:
            raise InvalidArgument(f"backend={self.backend!r}; allowed: {', '.join(BACKENDS)}")
        device = self.device or default_device(self.backend)
        if device not in DEVICES:
            raise InvalidArgument(f"device={device!r}; allowed: {', '.join(DEVICES)}")
        if self.backend == "nccl" and device != "cuda":
            raise InvalidArgument(f"device={device!r} with backend='nccl'; nccl needs device='cuda'")
        object.__setattr__(self, "device", device)
        self._check_world_sizes_and_dtypes()
        _positive("timeout", self.timeout)
        if self.timeout is not None and self.timeout > MAX_TIMEOUT:
            # the ranks' gloo timeout is a multiple of it: 1e9 s overflowed the store's client
            # timeout and crashed the pool's start (exit 3 for a new user)
            raise InvalidArgument(
                f"timeout={self.timeout!r}; must be at most {MAX_TIMEOUT:g} seconds (a day)"
            )
        _positive("deadline", self.deadline)
        if isinstance(self.finish_shrink, bool) or self.finish_shrink != 0:  # 0 turns finishing off
            _positive("finish_shrink", self.finish_shrink)
        _positive("max_examples", self.max_examples, integer=True)
        if not isinstance(self.stop_at_first, bool):
            raise InvalidArgument(f"stop_at_first={self.stop_at_first!r}; expected True or False")
        if self.profile is not None and self.profile not in PROFILES:
            raise InvalidArgument(f"profile={self.profile!r}; allowed: {', '.join(PROFILES)}")
        object.__setattr__(self, "tolerance", as_tolerance(self.tolerance))
        self._check_exclude_and_options()
        object.__setattr__(self, "database", check_database(self.database) or env_database())
        object.__setattr__(self, "fleet", check_fleet(self.fleet) if self.fleet is not None else env_fleet())
        if self.ranks is not None:
            bind_address(self.ranks)  # the error names --ranks and its value
        if self.secret_file is not None and not isinstance(self.secret_file, str):
            raise InvalidArgument(f"secret_file={self.secret_file!r}; must be a path")
        for flag in ("deterministic", "debug_collectives"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidArgument(f"{flag}={getattr(self, flag)!r}; must be True or False")

    def _check_world_sizes_and_dtypes(self) -> None:
        """world_sizes: ints >= 1 within the limits; dtypes: among DTYPES (a str for one)."""
        if self.world_sizes is not None:
            sizes = world_sizes_form(self.world_sizes)
            for w in sizes:
                check_world_size(w, "world_sizes")
            object.__setattr__(self, "world_sizes", sizes)
        if self.dtypes is not None:
            dts = (self.dtypes,) if isinstance(self.dtypes, str) else tuple(self.dtypes)
            if not dts or any(d not in DTYPES for d in dts):
                raise InvalidArgument(f"dtypes={self.dtypes!r}; choose from {', '.join(DTYPES)}")
            object.__setattr__(self, "dtypes", dts)

    def _check_exclude_and_options(self) -> None:
        """exclude: case expressions (checked now); options: sorted (name, JSON scalar) pairs."""
        exprs = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude or ())
        for text in exprs:
            if not isinstance(text, str):
                raise InvalidArgument(f"exclude={self.exclude!r}; must be expression strings")
            CaseExpression(text, "exclude")
        object.__setattr__(self, "exclude", exprs)
        pairs = tuple(sorted(dict(self.options or {}).items()))
        for name, value in pairs:
            if not isinstance(name, str) or not isinstance(value, (str, int, float, bool, type(None))):
                raise InvalidArgument(f"options={self.options!r}; names must be str, values JSON scalars")
        object.__setattr__(self, "options", pairs)

    def restrictions(self) -> str:
        """What the run restricts, in words (`` (world sizes 1, 2; dtypes bfloat16; option
        steps=2)``; empty when nothing): the CLI's "fuzzing ..." line and a pytest test's
        statistics header, so that two tests of one implementation read apart."""
        parts = [f"world sizes {', '.join(map(str, self.world_sizes))}"] if self.world_sizes else []
        parts += [f"dtypes {', '.join(self.dtypes)}"] if self.dtypes else []
        parts += [f"tolerance {format_tolerance(n, t)}" for n, t in self.tolerance.per_output]
        parts += [f"precision {self.tolerance.precision}"] if self.tolerance.precision else []
        parts += [f"excluding {e}" for e in self.exclude]
        parts += [f"option {n}={v!r}" for n, v in self.options]
        return f" ({'; '.join(parts)})" if parts else ""

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (validated again); unknown names are an error."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise InvalidArgument(f"unknown RunConfig field(s) {sorted(unknown)}; allowed: {field_names()}")
        return dataclasses.replace(self, **changes)

    # -- serialisation (child jobs) -------------------------------------------------------------
    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["tolerance"] = dataclasses.asdict(self.tolerance)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise InvalidArgument(f"run configuration is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise InvalidArgument(f"run configuration must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise InvalidArgument(f"run configuration has unknown field(s) {sorted(unknown)}")
        tol = d.pop("tolerance", None)
        for key in ("world_sizes", "dtypes", "exclude"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        d["options"] = tuple(tuple(p) for p in d.get("options") or ())
        return cls(tolerance=Tolerance(**tol) if tol else Tolerance(), **d)


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]
