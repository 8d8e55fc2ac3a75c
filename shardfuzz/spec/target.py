"""The Target: a sharded implementation paired with its single-process oracle. With the records of
:mod:`shardfuzz.spec.records` (planted bugs, expected failures) and its triggers, a target file is the
whole spec.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from shardfuzz.case import DTYPES, PROFILE_PARAM_NAMES, Case, pin_options
from shardfuzz.errors import InvalidArgument, TargetCodeError, TargetError
from shardfuzz.protocol import ImplRef
from shardfuzz.spec.bounds import PROFILE_PARAMS, CaseBounds, Split, bounds_of, branches_drawing, declare
from shardfuzz.spec.budget import check_budgets
from shardfuzz.spec.exclude import known_failures
from shardfuzz.spec.layouts import Layout, Replicate, check_layout
from shardfuzz.spec.records import Bound, ExpectedFailure, PlantedBug, Verified, bind
from shardfuzz.spec.refs import module_ref, ref_of_callable
from shardfuzz.spec.tolerance import per_output_tolerances
from shardfuzz.spec.triggers import conditions_named

# Hypothesis is imported inside the functions that use it: the CLI's parser or the pytest
# plugin loads this module at start (START_UP in tests/test_structure.py)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["Target"]

#: ``Target(oracle=SELF)``: the implementation at world size 1 in float64 is the oracle
SELF = "self"
#: the most conditions a target may mark ``important``: their triples (20 at 6) cost 0-2 more rows
MAX_IMPORTANT = 6

Outputs = Mapping[str, Layout]


#: the role of an implementation with no record, and what ``shardfuzz list`` says of them once
UNDER_TEST = "under test"
UNDER_TEST_NOTE = (
    "under test: fuzz it with --impl NAME; a record (PlantedBug, ExpectedFailure, Verified) is optional "
    "and lets a test check what a run finds (docs/reference/target-spec.md)"
)


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
    """A named differential test.

    Args:
        name: the target's name (also the ``Case.target`` its cases carry).
        cases: a Hypothesis strategy of :class:`~shardfuzz.Case`, or a callable
            ``cases(world_sizes=(1, 2, 3, 4))`` returning one (preferred: the fuzzer can then honour
            ``--shardfuzz-world-sizes`` without filtering).
        inputs: ``inputs(case) -> dict[str, Tensor]``: the *full* inputs, built on CPU from
            ``case.seed`` with a ``torch.Generator``, in ``case.dtype`` for floating tensors. It is
            called on every rank and in the driver, and must give identical tensors everywhere.
        oracle: ``oracle(inputs, case) -> dict[str, Tensor | value]``: the single-process result,
            run on the inputs upcast to float64 (the reference) and as they are (the case dtype);
            or ``"self"``: the implementation under test itself, at world size 1 in float64
            (:mod:`shardfuzz.engine.selforacle`).
        outputs: name -> :class:`~shardfuzz.Layout` of every output the implementations return, or
            a function ``outputs(case)`` returning that mapping when the outputs depend on the case.
        implementations: name -> implementation, as ``"pkg.mod:func"``, ``"file.py::NAME"``, a
            module-level function, the bare name of a function in the target's own module, or
            :func:`bind` of one of those. An implementation is called once per rank as
            ``impl(ctx)`` with a :class:`~shardfuzz.RankContext` and returns a dict of local outputs.
        input_layouts: name -> layout used to fill ``ctx.local`` (default: ``Replicate()``).
        layout_free: inputs whose memory layout the implementation must not depend on: in a case
            whose option ``strided`` is True (``shardfuzz.strategies.cases(strided_inputs=True)``
            draws it), their ``ctx.local`` pieces are non-contiguous views with the same values
            (:func:`shardfuzz.spec.layouts.strided_view`), so code that hands them to a collective
            as they are is caught (gloo reads such a tensor's memory as if it were contiguous).
        magnitude: optional, rarely needed: ``magnitude(inputs64, case) -> dict[str, Tensor]``: per
            output, an elementwise bound on the sum of |terms| (``|x| @ |w|``, :mod:`shardfuzz.spec.magnitudes`);
            it replaces the output's scale in the tolerance's floor.
        tolerance: optional output name -> :class:`~shardfuzz.OutputTolerance` (``rtol``, ``atol``): a
            fixed tolerance for that output in place of the noise model. A run's own overrides
            (``--tolerance``, ``run(tolerance=...)``) win over these.
        reference: the name of the correct implementation.
        planted: :class:`PlantedBug` records. Each becomes an implementation under its name (by
            default the reference bound with ``bug=NAME``); the test suite proves each is found.
        expected_failures: :class:`ExpectedFailure` records for implementations known to fail.
        verified: :class:`Verified` records: implementations (usually upstream code) verified to
            pass under stated settings; the test suite runs each one.
        triggers: name -> ``predicate(case)``: the bug-hiding conditions this target's options and
            sizes stand for (``"steps>=2"``, ``"causal"``, ...). Statistics, progress lines and the
            test suite use them, beside the generic ones of :mod:`shardfuzz.spec.triggers`.
        effective: condition -> ``predicate(case)``: when a condition is real (``causal`` does
            nothing on a sequence of one). The key is a trigger, an ``option=value`` condition of the
            covering rows, or an option's name (each of its values). A case where the predicate is
            false does not reach the condition: statistics, covering rows and ``Expect(needs=)``
            do not count it.
        per_group: name -> a size name, an option name or ``fn(case) -> int``: quantities that
            matter against the size of the group under test (KV heads, microbatches, the vocab).
            Each adds the triggers ``NAME<group``, ``NAME%group!=0`` and ``group%NAME==0`` (1 <
            NAME < group: replication, as KV heads on more ranks than heads) where they hold.
        important: up to :data:`MAX_IMPORTANT` conditions (triggers or ``option=value``) whose
            triples the covering rows reach too, not only their pairs (a bug that needs three at
            once: ZeRO stage 2, accumulation and 2+ ranks).
        gradients: the outputs that come from a backward pass (the ``backward`` trigger).
        distinct: option names whose values tell one bug from another (``dtensor_ops``' ``op``):
            part of every finding's signature, so a campaign keeps one finding per value.
        description: one line for ``shardfuzz list``.
        collectives: the collectives the implementations use (e.g. ``("all_reduce",)``); decides
            whether the target can run several ranks on one GPU with gloo (see :mod:`shardfuzz.ranks.gpu`).
        supports: optional ``supports(case) -> None | reason``: a case the target cannot handle is
            rejected loudly (counted by reason), never passed silently.
        known_failures: known failures to set aside while fuzzing: a mapping reason -> predicate of
            the case (or an expression string, as ``--exclude`` takes), or a sequence of them. A
            matching case is counted as excluded and shown, never run or passed.
        comm: implementation name -> ``fn(case) -> CommBudget``, the most it may send per rank.
    """

    name: str
    cases: Any
    inputs: Callable[[Any], dict[str, Any]]
    oracle: Callable[[dict[str, Any], Any], dict[str, Any]] | str
    outputs: Outputs | Callable[[Case], Outputs]
    implementations: Mapping[str, Any]
    input_layouts: Mapping[str, Layout] = dataclasses.field(default_factory=dict)
    layout_free: tuple[str, ...] = ()
    magnitude: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    tolerance: Any = ()  # Mapping[str, OutputTolerance] in; sorted pairs after __post_init__
    reference: str = "reference"
    planted: Any = ()  # Iterable[PlantedBug] in, Mapping[str, PlantedBug] after __post_init__
    expected_failures: Any = ()  # Iterable[ExpectedFailure] in, Mapping[str, ExpectedFailure] after
    verified: Any = ()  # Iterable[Verified] in, Mapping[str, Verified] after __post_init__
    triggers: Mapping[str, Callable[[Case], bool]] = dataclasses.field(default_factory=dict)
    effective: Mapping[str, Callable[[Case], bool]] = dataclasses.field(default_factory=dict)
    important: tuple[str, ...] = ()
    per_group: Mapping[str, str | Callable[[Case], int]] = dataclasses.field(default_factory=dict)
    gradients: tuple[str, ...] = ()
    distinct: tuple[str, ...] = ()  # options whose values tell one bug from another (the operator)
    description: str = ""
    supports: Callable[[Any], str | None] | None = None
    collectives: tuple[str, ...] | None = None
    known_failures: Any = ()  # Mapping[str, predicate] or Sequence in; (reason, predicate) pairs after
    comm: Any = ()  # Mapping[implementation name, fn(case) -> CommBudget] (shardfuzz.verdict.comm)
    origin: str | None = None  # where workers re-import this target from: set automatically

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TargetError(f"Target(name={self.name!r}); must be an identifier-like string")
        self._check_pieces()
        object.__setattr__(self, "input_layouts", self._checked_input_layouts())
        object.__setattr__(self, "layout_free", _input_names(self.name, "layout_free", self.layout_free))
        if not self.implementations:
            raise TargetError(
                f"Target {self.name!r}: implementations={self.implementations!r}; name at least one"
            )
        if self.origin is None:
            object.__setattr__(self, "origin", module_ref(_caller_globals()))
        impls = dict(self.implementations)
        if self.reference not in impls:
            raise TargetError(
                f"Target {self.name!r}: reference={self.reference!r} is not among implementations {sorted(impls)}"
            )
        planted, expected = self._records_into(impls)
        object.__setattr__(self, "implementations", impls)
        object.__setattr__(self, "planted", planted)
        object.__setattr__(self, "expected_failures", expected)
        object.__setattr__(self, "verified", self._verified(impls))
        object.__setattr__(self, "triggers", dict(self.triggers))
        for tname, pred in self.triggers.items():
            if not callable(pred):
                raise TargetError(f"Target {self.name!r}: triggers[{tname!r}]={pred!r} is not a callable")
        object.__setattr__(self, "effective", dict(self.effective))
        object.__setattr__(self, "important", tuple(self.important))
        object.__setattr__(self, "distinct", _option_names(self.name, "distinct", self.distinct))
        object.__setattr__(self, "per_group", dict(self.per_group))
        for qname, how in self.per_group.items():
            if not isinstance(qname, str) or not (isinstance(how, str) or callable(how)):
                raise TargetError(
                    f"Target {self.name!r}: per_group[{qname!r}]={how!r}; expected a size name, an "
                    "option name or a callable fn(case) -> int"
                )
        if len(self.important) > MAX_IMPORTANT or not all(isinstance(c, str) for c in self.important):
            raise TargetError(
                f"Target {self.name!r}: important={self.important!r}; expected at most {MAX_IMPORTANT} "
                "condition names (each triple of them costs covering rows)"
            )
        for cname, pred in self.effective.items():
            if not isinstance(cname, str) or not callable(pred):
                raise TargetError(
                    f"Target {self.name!r}: effective[{cname!r}]={pred!r}; expected a condition name "
                    "and a callable predicate(case)"
                )
        object.__setattr__(self, "gradients", tuple(self.gradients))
        object.__setattr__(self, "known_failures", known_failures(self.known_failures, self.name))
        self._check_known_failure_triggers()
        object.__setattr__(self, "comm", check_budgets(self.comm, self.name, self.implementations))
        self._check_tolerance_and_gradients()

    def _checked_input_layouts(self) -> dict[str, Layout]:
        """``input_layouts`` as a dict of layouts."""
        if not isinstance(self.input_layouts, Mapping):
            raise TargetError(
                f"Target {self.name!r}: input_layouts={self.input_layouts!r}; must be a mapping input name -> "
                "layout (a layout does not depend on the case: where it must, build the DTensor in the "
                "implementation, from ctx.mesh.device_mesh())"
            )
        return {k: check_layout(v, f"input_layouts[{k!r}]") for k, v in self.input_layouts.items()}

    def _check_known_failure_triggers(self) -> None:
        """A known failure's expression that tests a condition no case can reach would exclude nothing."""
        named = conditions_named(self)
        for reason, pred in self.known_failures:
            for trigger in sorted(getattr(pred, "triggers_read", frozenset()) - named):
                raise TargetError(
                    f"Target {self.name!r}: known_failures[{reason!r}] tests {trigger!r} in triggers, a "
                    f"condition no case of it can reach (a misspelling?); its own: {sorted(self.triggers)}"
                )

    def _check_pieces(self) -> None:
        """inputs and oracle are callables (or the self-oracle), cases and outputs are given."""
        for piece in ("inputs", "oracle"):
            if not callable(getattr(self, piece)) and (piece, getattr(self, piece)) != ("oracle", SELF):
                also = f" or {SELF!r} (a self-oracle)" if piece == "oracle" else ""
                raise TargetError(
                    f"Target {self.name!r}: {piece}={getattr(self, piece)!r} must be a callable{also}; "
                    "a target needs cases, inputs, oracle, outputs and implementations"
                )
        if self.cases is None:
            raise TargetError(f"Target {self.name!r}: cases=None; pass a strategy of Case or a callable")
        if not self.outputs:
            raise TargetError(f"Target {self.name!r}: outputs={self.outputs!r}; name at least one output")
        if not callable(self.outputs):
            object.__setattr__(self, "outputs", _check_outputs(self.outputs, self.name))

    def _records_into(self, impls: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The planted bugs and expected failures by name; each one's implementation is added to
        ``impls`` (its own, or the reference bound with ``bug=NAME``)."""
        planted = _records(self.planted, PlantedBug, self.name, "planted")
        expected = _records(self.expected_failures, ExpectedFailure, self.name, "expected_failures")
        for rec in [*planted.values(), *expected.values()]:
            if rec.impl is not None:
                impls[rec.name] = rec.impl
            elif rec.name not in impls:
                impls[rec.name] = bind(impls[self.reference], bug=rec.name)
        return planted, expected

    def _verified(self, impls: dict[str, Any]) -> dict[str, Verified]:
        """The verified records by name: each names an implementation that is not a known failure."""
        verified = _records(self.verified, Verified, self.name, "verified")
        for name in verified:
            if name not in impls or name in self.planted or name in self.expected_failures:
                passing = sorted(
                    n for n in impls if n not in self.planted and n not in self.expected_failures
                )
                raise TargetError(
                    f"Target {self.name!r}: verified names {name!r}, which is not one of its implementations "
                    f"that may pass: {', '.join(passing)}"
                )
        return verified

    def _check_tolerance_and_gradients(self) -> None:
        """Per-output tolerances and declared gradients name outputs of the target."""
        tol = per_output_tolerances(self.tolerance, f"Target {self.name!r}: tolerance")
        object.__setattr__(self, "tolerance", tol)
        if not callable(self.outputs):
            bad = [o for o, _ in tol if o not in self.outputs]
            if bad:
                raise TargetError(
                    f"Target {self.name!r}: tolerance names {bad[0]!r}, which is not an output; "
                    f"outputs are {sorted(self.outputs)}"
                )
        if not callable(self.outputs):
            unknown = [g for g in self.gradients if g not in self.outputs]
            if unknown:
                raise TargetError(
                    f"Target {self.name!r}: gradients names {unknown}, which are not outputs; "
                    f"outputs are {sorted(self.outputs)}"
                )

    # -- outputs --------------------------------------------------------------------------
    def outputs_for(self, case: Case) -> dict[str, Layout]:
        """The outputs (name -> layout) of this case."""
        if callable(self.outputs):
            try:
                outputs = self.outputs(case)
            except Exception as e:
                raise TargetCodeError.of(self.name, "outputs(case)", case, e) from e
            return _check_outputs(outputs, self.name)
        return dict(self.outputs)

    # -- implementations -------------------------------------------------------------------
    def impl_ref(self, impl: Any = None) -> ImplRef:
        """Resolve an implementation (name, ref, function or :func:`bind`) to what workers import."""
        impl = self.reference if impl is None else impl
        if isinstance(impl, ImplRef):
            return impl
        what = "impl"
        if isinstance(impl, str) and impl in self.implementations:
            what, impl = f"implementations[{impl!r}]", self.implementations[impl]
        elif isinstance(impl, str) and ":" not in impl:
            close = difflib.get_close_matches(impl, list(self.implementations), n=1)
            raise TargetError(
                f"impl={impl!r} is not an implementation of target {self.name!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; known: {', '.join(self.implementations)}; or pass 'pkg.mod:func' / 'file.py::NAME'"
            )
        kwargs: dict[str, Any] = {}
        while isinstance(impl, Bound):
            kwargs = {**impl.kwargs, **kwargs}
            impl = impl.impl
            if isinstance(impl, str) and impl in self.implementations:
                impl = self.implementations[impl]  # bind("reference", ...): one name lookup
        if isinstance(impl, str) and ":" not in impl and self.origin:
            impl = f"{self.origin}::{impl}" if self.origin.endswith(".py") else f"{self.origin}:{impl}"
        return ImplRef.from_parts(ref_of_callable(impl, what), kwargs)

    def impl_name(self, impl: Any = None) -> str:
        impl = self.reference if impl is None else impl
        if isinstance(impl, str):
            return impl
        if isinstance(impl, ImplRef):
            return str(impl)
        if isinstance(impl, Bound):
            return f"{self.impl_name(impl.impl)}({', '.join(f'{k}={v!r}' for k, v in impl.kwargs.items())})"
        return getattr(impl, "__qualname__", repr(impl))

    def role(self, impl_name: str) -> str:
        """``reference (...)``, ``planted bug: ...``, ``expected failure: ...``, ``verified to pass:
        ...`` or ``under test (...)``: one with no record (what ``shardfuzz list`` prints)."""
        if impl_name == self.reference:
            return "reference (fuzzed when no --impl is given)"
        if impl_name in self.planted:
            return f"planted bug: {self.planted[impl_name].description}"
        if impl_name in self.expected_failures:
            return f"expected failure: {self.expected_failures[impl_name].description}"
        if impl_name in self.verified:
            return f"verified to pass: {self.verified[impl_name].what}"
        # not "no record: not a planted bug, ...": two new users whose tutorial-style bugs are plain
        # implementations read that as something wrong with them (what a record adds: UNDER_TEST_NOTE)
        return UNDER_TEST

    def strategy(
        self,
        world_sizes: tuple[int, ...] | None = None,
        dtypes: tuple[str, ...] | None = None,
        options: tuple[tuple[str, Any], ...] = (),
    ) -> SearchStrategy[Case]:
        """The Hypothesis strategy of cases, restricted to ``world_sizes`` and ``dtypes`` when
        given, with ``options`` (name, value) pinned: the draws of :meth:`drawn` through
        :meth:`restrict`."""
        s = self.drawn(world_sizes, frozenset(name for name, _ in options))
        through = self.restrict(dtypes, options)
        return s if through is None else s.map(through)

    def drawn(
        self, world_sizes: tuple[int, ...] | None = None, option_names: frozenset[str] = frozenset()
    ) -> SearchStrategy[Case]:
        """The cases a run draws before its dtypes and option values are put in (the covering pool
        draws these too): at ``world_sizes``, and only from the branches of a ``one_of`` whose
        cases carry every option in ``option_names`` (an option that exists in one branch only,
        such as tp_mlp's ``sequence_parallel``, can be pinned)."""
        from hypothesis.strategies import SearchStrategy

        if isinstance(self.cases, SearchStrategy):
            s = self._branches_with(self.cases, option_names)
            if world_sizes:
                allowed = set(world_sizes)
                s = s.filter(lambda c: c.world_size in allowed)
            return s
        if isinstance(self.cases, _RenamedCases):  # a derived target: the base selects its branches
            return self.cases(world_sizes, option_names)
        if callable(self.cases):
            s = self.cases(world_sizes=world_sizes) if world_sizes else self.cases()
            return self._branches_with(s, option_names)
        raise TargetError(f"Target {self.name!r}: cases={self.cases!r} is neither a strategy nor a callable")

    def _branches_with(self, s: Any, names: frozenset[str]) -> Any:
        """``s``, or the ``one_of`` of its branches that draw every option in ``names``; a
        strategy that declares no bounds is kept whole (``pin_options`` checks each case)."""
        from hypothesis import strategies as st

        found = branches_drawing(s, names) if names else None
        if found is None:
            return s
        chosen, every = found
        if all(names <= o for o in every):  # every branch has them: the strategy as it is, same draws
            return s
        if not chosen:
            known = sorted(frozenset().union(*every))
            missing = sorted(names - frozenset(known))
            if missing:
                # a value profile's parameters (scale, grid) are options of a case, not the target's
                own = [k for k in known if k not in PROFILE_PARAM_NAMES]
                set_by = [k for k in known if k in PROFILE_PARAM_NAMES]
                if missing[0] in PROFILE_PARAM_NAMES:
                    of = [p for p, params in PROFILE_PARAMS.items() if missing[0] in params]
                    drawn = sorted({p for b in bounds_of(s) or () for p in b.profiles})
                    raise InvalidArgument(
                        f"option {missing[0]!r} pinned: a parameter of the {' and '.join(of)} value "
                        f"profile{'s' if len(of) > 1 else ''}, which target {self.name!r} does not draw; "
                        f"it draws {', '.join(drawn)}"
                    )
                raise InvalidArgument(
                    f"option {missing[0]!r} pinned, but target {self.name!r} has no such option; "
                    f"its options: {', '.join(own) or 'none'}"
                    + (f" (and {', '.join(set_by)}, set by its value profiles)" if set_by else "")
                )
            shown = "; ".join("{" + ", ".join(sorted(o)) + "}" for o in every)
            raise InvalidArgument(
                f"options {', '.join(map(repr, sorted(names)))} pinned together, but no branch of target "
                f"{self.name!r}'s cases has them all; its branches' options: {shown}"
            )
        return chosen[0] if len(chosen) == 1 else st.one_of(chosen)

    @functools.cached_property
    def replica_splits(self) -> frozenset[str]:
        """The sizes its strategy splits over the replicas of a dp x tp mesh (``Split(over="replicas")``),
        read once from the bounds it declares."""
        return frozenset(
            name
            for bounds in self.case_bounds() or ()
            for name, spec in bounds.sizes
            if isinstance(spec, Split) and spec.over == "replicas"
        )

    def case_bounds(self, world_sizes: tuple[int, ...] | None = None) -> tuple[CaseBounds, ...] | None:
        """What the strategy of a run at ``world_sizes`` declares it draws (one record per branch,
        :mod:`shardfuzz.spec.bounds`); None when it declares nothing. A strategy given as it is
        declares its own world sizes (a run only filters it)."""
        from hypothesis.strategies import SearchStrategy

        if isinstance(self.cases, SearchStrategy):
            return bounds_of(self.cases)
        if callable(self.cases):
            return bounds_of(self.cases(world_sizes=world_sizes) if world_sizes else self.cases())
        raise TargetError(f"Target {self.name!r}: cases={self.cases!r} is neither a strategy nor a callable")

    def restrict(
        self, dtypes: tuple[str, ...] | None = None, options: tuple[tuple[str, Any], ...] = ()
    ) -> Callable[[Case], Case] | None:
        """The map :meth:`strategy` puts over every drawn case for ``dtypes`` and pinned
        ``options`` (None: none). A map draws no choices: the covering pool of a restricted run is
        the unrestricted draws through it."""
        steps: list[Callable[[Case], Case]] = []
        if dtypes:
            steps.append(functools.partial(_in_dtypes, tuple(dtypes)))
        if options:
            profiles = self._profiles_drawn() if set(dict(options)) & PROFILE_PARAM_NAMES else None
            steps.append(functools.partial(pin_options, self.name, dict(options), profiles=profiles))
        return functools.partial(_through, tuple(steps)) if steps else None

    def _profiles_drawn(self) -> list[str] | None:
        """The value profiles its bounds declare; None when it declares none (a replay then takes
        any profile's parameters on a case of that profile, as :func:`check_case` does)."""
        bounds = bounds_of(self.drawn())
        return sorted({p for b in bounds for p in b.profiles}) if bounds else None

    def input_layout(self, name: str) -> Layout:
        return self.input_layouts.get(name, Replicate())

    def spec(self) -> str:
        """A reference that finds this target again from any folder: ``/abs/path/file.py::NAME`` for a
        target defined in a file, ``pkg.mod:ATTR`` for one in an importable module
        (:func:`shardfuzz.spec.registry.target_spec` gives built-in and entry-point targets' names)."""
        if not self.origin:
            return self.worker_ref()  # raises: workers could not import it either
        if self.origin.endswith(".py"):
            return f"{self.origin}::{self.name}"
        module = sys.modules.get(self.origin)
        attrs = [k for k, v in vars(module).items() if v is self] if module is not None else []
        return f"{self.origin}:{attrs[0] if attrs else self.name}"

    def worker_ref(self) -> str:
        if not self.origin:
            raise TargetError(
                f"Target {self.name!r} was defined where workers cannot import it (no module file)"
            )
        return f"{self.origin}::{self.name}" if self.origin.endswith(".py") else f"{self.origin}:{self.name}"

    # -- deriving --------------------------------------------------------------------------
    def derive(
        self, name: str, *, implementations: Mapping[str, Any] | None = None, **changes: Any
    ) -> Target:
        """A new target from this one: ``MINE = tp_mlp.TARGET.derive("my_tp", implementations={...})``.

        Define it at module level (workers import it by name from your module). New
        implementations given by bare name are looked up in *your* module; the reference and the
        other non-planted implementations of this target are kept (already resolved), its planted
        bugs, expected failures and verified records are left behind. ``changes`` replace other fields (``cases``,
        ``description``, ``reference``, ...).
        """
        kept = {
            n: self.impl_ref(n)
            for n in self.implementations
            if n not in self.planted and n not in self.expected_failures
        }
        impls: dict[str, Any] = {n: _bound_of(r) for n, r in kept.items()}
        impls.update(implementations or {})
        fields: dict[str, Any] = {
            "planted": (),
            "expected_failures": (),
            "verified": (),
            "origin": module_ref(_caller_globals()),
            "cases": _RenamedCases(self, name),
        }
        fields.update(changes)
        return dataclasses.replace(self, name=name, implementations=impls, **fields)

    def __repr__(self) -> str:
        return f"Target({self.name!r})"


class _RenamedCases:
    """A derived target's cases: the base target's, carrying the new name."""

    def __init__(self, base: Target, name: str) -> None:
        self.base, self.name = base, name

    def __call__(
        self, world_sizes: tuple[int, ...] | None = None, option_names: frozenset[str] = frozenset()
    ) -> Any:
        drawn = self.base.drawn(world_sizes, option_names)  # only the branches with the pinned options
        renamed = drawn.map(lambda c: dataclasses.replace(c, target=self.name))
        bounds = (bounds_of(drawn) if option_names else None) or self.base.case_bounds(world_sizes)
        return declare(renamed, bounds)  # a new name, the same bounds


def _bound_of(ref: ImplRef) -> Any:
    return bind(ref.ref, **dict(ref.kwargs)) if ref.kwargs else ref.ref


def _caller_globals() -> dict[str, Any]:
    """The globals of the first frame outside this module and dataclasses (the target's module)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "dataclasses"):
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_globals if frame is not None else {}


def _input_names(target: str, field: str, names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of non-empty strings (input names are checked against ``inputs(case)``
    when a case runs)."""
    if (
        isinstance(names, str)
        or not isinstance(names, Iterable)
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise TargetError(f"Target {target!r}: {field}={names!r}; must be a tuple of input names")
    return tuple(names)


def _check_outputs(outputs: Any, target: str) -> dict[str, Layout]:
    if not isinstance(outputs, Mapping) or not outputs:
        raise TargetError(f"Target {target!r}: outputs={outputs!r}; must map output names to layouts")
    return {k: check_layout(v, f"outputs[{k!r}]") for k, v in outputs.items()}


def _records(
    records: Any, cls: type[PlantedBug | ExpectedFailure | Verified], target: str, field: str
) -> dict[str, Any]:
    if isinstance(records, Mapping):
        records = list(records.values())
    out: dict[str, Any] = {}
    for rec in records if isinstance(records, Iterable) else [records]:
        if not isinstance(rec, cls):
            raise TargetError(
                f"Target {target!r}: {field} holds {rec!r}; expected {cls.__name__}(...) records"
            )
        if rec.name in out:
            raise TargetError(f"Target {target!r}: {field} names {rec.name!r} twice")
        out[rec.name] = rec
    return out


def _in_dtypes(chosen: tuple[str, ...], case: Case) -> Case:
    """``case`` in one of the ``chosen`` dtypes, spread evenly over them: picked by its drawn dtype
    and its seed (a map draws no choice), so that a dtype the target never draws gets its share
    too (keeping each drawn dtype that was chosen, a run of ``float32,float64,bfloat16,float16``
    drew no float16 at all). A case shrinks toward seed 0 and the target's first dtype (float32,
    mostly): toward the first chosen dtype."""
    if len(chosen) == 1:
        return case if case.dtype == chosen[0] else dataclasses.replace(case, dtype=chosen[0])
    dtype = chosen[(DTYPES.index(case.dtype) + case.seed) % len(chosen)]
    return case if dtype == case.dtype else dataclasses.replace(case, dtype=dtype)


def _through(steps: tuple[Callable[[Case], Case], ...], case: Case) -> Case:
    for step in steps:
        case = step(case)
    return case


def _option_names(target: str, field: str, names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of option names, or a :class:`TargetError` naming the field."""
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise TargetError(f"Target {target!r}: {field}={names!r}; expected a tuple of option names")
    return tuple(names)
