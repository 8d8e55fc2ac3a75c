"""The records a target file declares: planted bugs and expected failures (:class:`KnownFailure`),
the finding each must give (:class:`Expect`), implementations verified to pass (:class:`Verified`),
and implementations bound with arguments (:func:`bind`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from shardfuzz.case import Case
from shardfuzz.errors import TargetError
from shardfuzz.limits import MAX_WORLD_SIZE

KINDS = ("mismatch", "layout", "rank-error", "hang", "ignored-collective", "communication")


@dataclasses.dataclass(frozen=True)
class Bound:
    """An implementation bound with keyword arguments (see :func:`bind`)."""

    impl: Any
    kwargs: Mapping[str, Any]


def bind(impl: Any, **kwargs: Any) -> Bound:
    """``impl`` called as ``impl(ctx, **kwargs)`` on every rank, e.g. ``bind("reference", bug="x")``.

    The arguments travel to the ranks and into failure files, so they must be JSON values.
    """
    for k, v in not_json_values(kwargs).items():
        raise TargetError(f"bind({impl!r}, {k}={v!r}): arguments must be str, int, float, bool or None")
    return Bound(impl, dict(kwargs))


def not_json_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that cannot travel to the ranks and into failure files (bound
    arguments, pinned options): anything but str, int, float, bool or None."""
    return {k: v for k, v in values.items() if not isinstance(v, (str, int, float, bool, type(None)))}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Expect:
    """What the shrunk counterexample of a planted bug (or expected failure) must look like:
    structure, never seeds. Keyword-only: a record reads as what it says
    (``Expect(kind="mismatch", world_size=2, mesh=(2,), outputs=("y",))``).

    Attributes:
        kind: the failure kind ("mismatch", "layout", "rank-error", "hang", "ignored-collective",
            "communication"), or a tuple of them for a bug with several minimal forms (the shrinker
            minimises the first kind it meets: ``kinds``).
        world_size, mesh: the smallest world size and mesh that trigger the bug (``world_size`` may
            be a tuple of accepted sizes, with ``mesh=None`` meaning the 1-D mesh).
        uneven: the split sizes that must be uneven in the minimal case; all others must be even
            (``None``: not checked, when ``check`` accepts several minimal forms).
        check: an extra structural predicate on the case.
        outputs: for mismatches, exactly these outputs are wrong (e.g. only a gradient), or a
            predicate on the tuple of wrong outputs.
        timeout: a fixed example timeout (hang bugs: keep it short).
        note: what ``check`` asks for, in words (required with ``check``): the docs' minimal-case
            column. Its plain facts (``hidden 3``, ``bfloat16``, ``2 ranks``) are confirmed on the
            shrunk case by :func:`note_contradictions`.
        needs: the trigger conditions the bug needs at once (labels of ``docs/triggers.md`` or of
            the target's ``triggers``, or ``option=value``, e.g. ``("uneven", "causal")``): the
            shrunk case must reach every one of them.
        exclude: ``--exclude`` expressions of the implementation's *other* known failures, set
            aside (counted) while this one is searched: one implementation, several findings.
        options: target options pinned while this one is searched (``--option NAME=VALUE``), e.g.
            the one operator of a target that draws hundreds: the shrunk case carries them.
    """

    kind: str | tuple[str, ...]
    world_size: int | tuple[int, ...]
    mesh: tuple[int, ...] | None = None  # None: the 1-D mesh of the shrunk case's world size
    uneven: tuple[str, ...] | None = ()
    check: Callable[[Case], bool] | None = None
    outputs: tuple[str, ...] | Callable[[tuple[str, ...]], bool] | None = None
    timeout: float | None = None
    note: str = ""
    needs: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    options: Any = ()  # Mapping[str, value] in; sorted (name, value) pairs after __post_init__

    def allows_outputs(self, wrong: tuple[str, ...]) -> bool:
        """Whether the shrunk mismatch's wrong outputs are what ``outputs`` asks for: its predicate,
        or exactly its names in any order (the CLI's summary lists them by name, a finding in the
        target's order); always, without ``outputs``."""
        if self.outputs is None:
            return True
        return self.outputs(wrong) if callable(self.outputs) else set(wrong) == set(self.outputs)

    def __post_init__(self) -> None:
        options = dict(self.options) if isinstance(self.options, (Mapping, tuple)) else None
        if options is None or not_json_values(options) or not all(isinstance(k, str) for k in options):
            raise TargetError(
                f"Expect(options={self.options!r}); expected a mapping of option names to plain values"
            )
        object.__setattr__(self, "options", tuple(sorted(options.items())))
        if not self.kinds or any(k not in KINDS for k in self.kinds):
            raise TargetError(f"Expect(kind={self.kind!r}); allowed: {', '.join(KINDS)}, or a tuple of them")
        if not isinstance(self.note, str):
            raise TargetError(
                f"Expect(note={self.note!r}); expected a string (what check asks for, in words)"
            )
        self._check_fields()
        if self.check is not None and not self.note.strip():
            # the docs show the note, not the lambda: a check nobody can read is a spec nobody can check
            raise TargetError(
                f"Expect(check={self.check!r}, note={self.note!r}): a check needs a note saying in words "
                "what it asks for (shown in the minimal-case column, confirmed on the shrunk case)"
            )

    def _check_fields(self) -> None:
        """Each structural field has the type the proof reads it as, checked now: a bare
        ``uneven=True`` or ``uneven="seq"`` was only found out after a whole search, by a
        TypeError (or a check of the letters s, e, q)."""

        def count(v: Any, least: int) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= least

        def names(v: Any) -> bool:
            return isinstance(v, tuple) and all(isinstance(x, str) and x for x in v)

        ws = self.world_size
        if not (count(ws, 1) or (isinstance(ws, tuple) and ws and all(count(w, 1) for w in ws))):
            raise TargetError(f"Expect(world_size={ws!r}); expected a world size >= 1, or a tuple of them")
        if self.mesh is not None and not (
            isinstance(self.mesh, tuple) and self.mesh and all(count(m, 1) for m in self.mesh)
        ):
            raise TargetError(
                f"Expect(mesh={self.mesh!r}); expected a mesh shape such as (2,) or (2, 2), or None"
            )
        if self.uneven is not None and not names(self.uneven):
            raise TargetError(
                f"Expect(uneven={self.uneven!r}); expected a tuple of the split sizes that must be uneven "
                "in the minimal case, e.g. ('batch',), () for all even, or None (not checked)"
            )
        if self.outputs is not None and not (
            callable(self.outputs) or (names(self.outputs) and len(set(self.outputs)) == len(self.outputs))
        ):
            raise TargetError(
                f"Expect(outputs={self.outputs!r}); expected a tuple of distinct output names, e.g. "
                "('grad_x',), a predicate on the tuple of wrong outputs, or None (not checked)"
            )
        if self.check is not None and not callable(self.check):
            raise TargetError(f"Expect(check={self.check!r}); expected a predicate on the case, or None")
        for field in ("needs", "exclude"):
            if not names(getattr(self, field)):
                raise TargetError(f"Expect({field}={getattr(self, field)!r}); expected a tuple of strings")
        t = self.timeout
        if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0):
            raise TargetError(f"Expect(timeout={t!r}); expected seconds > 0, or None")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The accepted kinds, as a tuple."""
        return self.kind if isinstance(self.kind, tuple) else (self.kind,)


#: an upstream link: ``owner/repo#N`` (an issue or pull request), ``owner/repo@COMMIT`` (the fix)
#: or an https address
LINK = re.compile(r"[\w.-]+/[\w.-]+(#\d+|@[0-9a-f]{7,40})|https://\S+")


class KnownFailure:
    """What planted bugs and expected failures share: an implementation that must fail, the
    finding it must give (:class:`Expect`) and how many examples that takes (``p95``). Each record
    is checked whole when it is made, so a bad record fails where it is written, not in a run."""

    name: str
    expect: Expect
    p95: int
    link: str
    impl: Any

    @property
    def what(self) -> str:
        """What it is, in one line: the real bug a planted bug models, or why a failure is expected."""
        raise NotImplementedError

    @property
    def description(self) -> str:
        return f"{self.what} ({self.link})" if self.link else self.what

    def __post_init__(self) -> None:
        record = f"{type(self).__name__}({self.name!r})"
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TargetError(f"{record}: name must be an identifier (it is the --impl name)")
        if not isinstance(self.what, str) or not self.what.strip():
            raise TargetError(f"{record}: say in one line what it is (models= / reason=)")
        if not isinstance(self.expect, Expect):
            raise TargetError(f"{record}: expect={self.expect!r}; expected an Expect(...) record")
        if isinstance(self.p95, bool) or not isinstance(self.p95, int) or self.p95 < 1:
            raise TargetError(
                f"{record}: p95={self.p95!r}; expected the examples to the first failure (an int >= 1, "
                "measured with benchmarks/budget.py)"
            )
        if self.link and not (isinstance(self.link, str) and LINK.fullmatch(self.link)):
            raise TargetError(
                f"{record}: link={self.link!r}; expected 'owner/repo#N', 'owner/repo@COMMIT' or an https address"
            )
        if self.impl is not None and not (isinstance(self.impl, (str, Bound)) or callable(self.impl)):
            raise TargetError(
                f"{record}: impl={self.impl!r}; expected an implementation name, 'pkg.mod:func', "
                "'file.py::NAME', bind(...) or a callable"
            )


@dataclasses.dataclass(frozen=True)
class PlantedBug(KnownFailure):
    """A planted bug: a small change to the reference that models a real bug.

    Attributes:
        name: the implementation name it gets (``--impl NAME``).
        models: what real bug it models, in one line.
        expect: the finding the fuzzer must make, shrunk (:class:`Expect`).
        p95: the 95th percentile of examples to the first failure over 20 seeds, measured with
            ``benchmarks/budget.py``; the test budget is ``2 * p95 + 10``.
        link: the upstream issue or pull request of the real bug, if there is one.
        impl: the implementation; default: the reference bound with ``bug=name``.
    """

    name: str
    models: str
    expect: Expect
    p95: int
    link: str = ""
    impl: Any = None

    @property
    def what(self) -> str:
        return self.models


@dataclasses.dataclass(frozen=True)
class ExpectedFailure(KnownFailure):
    """An implementation known to fail (usually real upstream code), with the finding it gives."""

    name: str
    reason: str
    expect: Expect
    p95: int
    link: str = ""
    impl: Any = None

    @property
    def what(self) -> str:
        return self.reason


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verified:
    """An implementation verified to pass, usually real upstream code restricted to what it
    supports: the test suite runs it under these settings (``tests/test_verified.py``), finds
    nothing, and sees every condition it names reached and every refusal it names counted;
    ``benchmarks/torch_impls.py`` runs the same records longer.

    Attributes:
        name: the implementation (one of the target's ``implementations``).
        what: what it is and how it is restricted, in one line (the target's docs page).
        examples: examples per dtype in the ci suite.
        dtypes: the dtypes it is verified in, each run on its own.
        options: options pinned to the implementation's contract (``run(options=)``).
        exclude: ``--exclude`` expressions of its known failures (the target's expected failures),
            set aside and counted (each run must set some aside).
        world_sizes: the world sizes to run (None: the target's).
        reaches: trigger conditions that cases which passed must reach (what makes the pass mean
            something: uneven shards, 3+ ranks, the options that matter).
        refuses: ``Unsupported`` reasons it must be seen refusing (counted): what it does not
            support is rejected loudly, never passed.
        also_reaches: conditions of this record alone (label -> ``predicate(case)``) that a case
            which passed must meet, where the target's triggers do not say it.
    """

    name: str
    what: str
    examples: int
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    world_sizes: tuple[int, ...] | None = None
    reaches: tuple[str, ...] = ()
    refuses: tuple[str, ...] = ()
    also_reaches: Mapping[str, Callable[[Case], bool]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        record = f"Verified(name={self.name!r})"
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TargetError(f"{record}: name must be the identifier of one of the target's implementations")
        if not isinstance(self.what, str) or not self.what.strip():
            raise TargetError(
                f"{record}: what={self.what!r}; say in one line what it is and how it is restricted"
            )
        if isinstance(self.examples, bool) or not isinstance(self.examples, int) or self.examples < 1:
            raise TargetError(f"{record}: examples={self.examples!r}; expected an int >= 1 (per dtype)")
        self._check_run(record)
        self._check_conditions(record)
        object.__setattr__(self, "options", dict(self.options))
        object.__setattr__(self, "also_reaches", dict(self.also_reaches))

    def _check_run(self, record: str) -> None:
        """dtypes, options and world sizes: what the run is given."""
        dtypes = self.dtypes
        if not dtypes or any(d not in DTYPE_WORDS for d in dtypes) or len(set(dtypes)) < len(dtypes):
            raise TargetError(
                f"{record}: dtypes={dtypes!r}; expected distinct ones of {', '.join(DTYPE_WORDS)}"
            )
        if not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options):
            raise TargetError(
                f"{record}: options={self.options!r}; expected a mapping of option names to values"
            )
        bad = not_json_values(self.options)
        if bad:  # the options travel to the ranks and into failure files
            raise TargetError(
                f"{record}: options={dict(self.options)!r}; {bad!r} must be str, int, float, bool or None"
            )
        ws = self.world_sizes
        if ws is not None and not (
            isinstance(ws, tuple)
            and ws
            and all(isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= MAX_WORLD_SIZE for w in ws)
        ):
            raise TargetError(
                f"{record}: world_sizes={ws!r}; expected a tuple of ints in [1, {MAX_WORLD_SIZE}], or None"
            )

    def _check_conditions(self, record: str) -> None:
        """exclude, reaches, refuses and also_reaches: what the run must show."""
        for field in ("exclude", "reaches", "refuses"):
            value = getattr(self, field)
            if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
                raise TargetError(f"{record}: {field}={value!r}; expected a tuple of strings")
        if not isinstance(self.also_reaches, Mapping):
            raise TargetError(
                f"{record}: also_reaches={self.also_reaches!r}; expected a mapping of labels to predicate(case)"
            )
        for label, pred in self.also_reaches.items():
            if not isinstance(label, str) or not callable(pred):
                raise TargetError(
                    f"{record}: also_reaches[{label!r}]={pred!r}; expected a label and a predicate(case)"
                )


DTYPE_WORDS = ("float64", "float32", "bfloat16", "float16")
_SIZE_FACT = re.compile(r"([a-z_]\w*) (-?\d+(?:\.\d+)?)")  # "hidden 3", "logit_scale 30"
_RANK_FACT = re.compile(r"(\d+) ranks?")
_COUNT_FACT = re.compile(r"(\d+) ([a-z][a-z-]*)")  # "2 steps", "1 micro-batch": a size or option counted
_NOT_ONE_FACT = re.compile(r"\b(or|any|not|no)\b|[<>=]")  # alternatives and bounds: no single fact


def note_facts(note: str) -> list[str]:
    """The plain facts a note states, clause by clause (clauses end at commas, ``and``,
    parentheses and before ``on N ranks``): ``NAME N`` (a size or option), ``N rank(s)``, ``N things``
    (a size or option named by the plural, hyphens dropped: ``2 micro-batches``), a dtype named
    alone (one dtype in the whole note). A note that gives alternatives or bounds anywhere ("or",
    "any", "not", "no", a comparison) states no single fact: none of it is read."""
    if not isinstance(note, str) or _NOT_ONE_FACT.search(note):
        return []
    dtypes = [d for d in DTYPE_WORDS if re.search(rf"\b{d}\b", note)]
    facts = []
    # "1,024" stays one number; "n 3 on 2 ranks" is two facts ("sharded on dim 0" stays prose)
    for clause in re.split(r",\s+|\s+and\s+|\s+on\s+(?=\d+ ranks?\b)|[()]", note):
        clause = clause.strip()
        if clause in DTYPE_WORDS:
            if len(dtypes) == 1:  # "bfloat16 and float32 alike" names no one dtype
                facts.append(clause)
        elif any(p.fullmatch(clause) for p in (_RANK_FACT, _SIZE_FACT, _COUNT_FACT)):
            facts.append(clause)
    return facts


def note_contradictions(note: str, case: Case) -> list[str]:
    """The facts of ``note`` (:func:`note_facts`) that ``case`` contradicts: a note says in words
    what a record's ``check`` asks for, and the shrunk case of its proof must bear it out. A fact
    about a name the case carries neither as a size nor as an option (``dim 0``, ``3 stages``) is
    prose, not read."""
    wrong = []
    for fact in note_facts(note):
        if fact in DTYPE_WORDS:
            ok = case.dtype == fact
        elif m := _RANK_FACT.fullmatch(fact):
            ok = case.world_size == int(m.group(1))
        else:
            if m := _SIZE_FACT.fullmatch(fact):
                names, value = [m.group(1)], m.group(2)
            else:  # "N things"
                value, noun = _COUNT_FACT.fullmatch(fact).groups()  # type: ignore[union-attr]
                word = noun.replace("-", "")
                names = [word, word + "s", word + "es"]
            if m and m.group(1) == "world_size":
                ok = case.world_size == float(value)
            else:
                carried = [n for n in names if n in case.sizes or n in case.options]
                if not carried:
                    continue
                ok = _carries(case, carried[0], float(value))
        if not ok:
            wrong.append(fact)
    return wrong


def _carries(case: Case, name: str, value: float) -> bool:
    """``case`` has the size or the numeric option ``name`` equal to ``value``."""
    have = case.sizes.get(name, case.options.get(name))
    return isinstance(have, (int, float)) and not isinstance(have, bool) and have == value
