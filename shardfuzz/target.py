"""The Target: a sharded implementation paired with its single-process oracle."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

from shardfuzz.errors import TargetError
from shardfuzz.layouts import Layout, Replicate, check_layout
from shardfuzz.registry import load_ref, module_ref, ref_of_callable


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
        oracle: ``oracle(inputs, case) -> dict[str, Tensor | value]``: the single-process result.
            The driver calls it twice: on the inputs upcast to float64 (the reference) and on the
            inputs as they are (to measure the rounding noise of the case dtype).
        outputs: name -> :class:`~shardfuzz.Layout` of every output the implementations return.
        implementations: name -> implementation, as ``"pkg.mod:func"``, ``"file.py::NAME"``, a
            module-level function, or the bare name of a function in the target's own module.
            An implementation is called once per rank as ``impl(ctx)`` with a
            :class:`~shardfuzz.RankContext` and returns a dict of local outputs.
        input_layouts: name -> layout used to fill ``ctx.local`` (default: ``Replicate()``).
        magnitude: optional ``magnitude(inputs64, case) -> dict[str, Tensor]``: for each output, an
            elementwise bound on the sum of absolute values of the terms that make it up (e.g.
            ``|x| @ |w|`` for ``x @ w``). When given, the tolerance is magnitude-aware.
        reference: the name of the correct implementation.
        planted: name -> one-line description of each planted-bug implementation and the real bug
            it models. The test suite proves the fuzzer finds each.
        expected_failures: name -> reason (with a link) for implementations known to fail upstream.
        description: one line for ``shardfuzz list``.
        collectives: the collectives the implementations use (e.g. ``("all_reduce",)``); decides
            whether the target can run several ranks on one GPU with gloo (see :mod:`shardfuzz.gpu`).
        supports: optional ``supports(case) -> None | reason``: a case the target cannot handle is
            rejected loudly (counted by reason in the statistics), never passed silently. Prefer
            strategies that do not draw such cases.
    """

    name: str
    cases: Any
    inputs: Callable[[Any], dict[str, Any]]
    oracle: Callable[[dict[str, Any], Any], dict[str, Any]]
    outputs: Mapping[str, Layout]
    implementations: Mapping[str, Any]
    input_layouts: Mapping[str, Layout] = dataclasses.field(default_factory=dict)
    magnitude: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    reference: str = "reference"
    planted: Mapping[str, str] = dataclasses.field(default_factory=dict)
    expected_failures: Mapping[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""
    supports: Callable[[Any], str | None] | None = None
    collectives: tuple[str, ...] | None = None
    #: where workers re-import this target from (module name or file path); set automatically
    origin: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TargetError(f"Target(name={self.name!r}); must be an identifier-like string")
        for piece in ("inputs", "oracle"):
            if not callable(getattr(self, piece)):
                raise TargetError(
                    f"Target {self.name!r}: {piece}={getattr(self, piece)!r} must be a callable; "
                    "a target needs cases, inputs, oracle, outputs and implementations"
                )
        if self.cases is None:
            raise TargetError(f"Target {self.name!r}: cases=None; pass a strategy of Case or a callable")
        if not self.outputs:
            raise TargetError(f"Target {self.name!r}: outputs={self.outputs!r}; name at least one output")
        outs = {k: check_layout(v, f"outputs[{k!r}]") for k, v in dict(self.outputs).items()}
        object.__setattr__(self, "outputs", outs)
        ins = {k: check_layout(v, f"input_layouts[{k!r}]") for k, v in dict(self.input_layouts).items()}
        object.__setattr__(self, "input_layouts", ins)
        if not self.implementations:
            raise TargetError(
                f"Target {self.name!r}: implementations={self.implementations!r}; name at least one"
            )
        if self.origin is None:
            caller = sys._getframe(1).f_globals
            if caller.get("__name__") == "dataclasses" or caller.get("__name__", "").startswith(
                "shardfuzz.target"
            ):
                caller = sys._getframe(2).f_globals
            object.__setattr__(self, "origin", module_ref(caller))
        impls = dict(self.implementations)
        object.__setattr__(self, "implementations", impls)
        for name in list(self.planted) + list(self.expected_failures):
            if name not in impls:
                raise TargetError(
                    f"Target {self.name!r}: {name!r} is listed as planted/expected but is not an implementation"
                )
        if self.reference not in impls:
            raise TargetError(
                f"Target {self.name!r}: reference={self.reference!r} is not among implementations {sorted(impls)}"
            )

    # -- implementations -------------------------------------------------------------------
    def impl_ref(self, impl: Any = None) -> str:
        """Resolve an implementation (name, ref or function) to an import reference workers can use."""
        impl = self.reference if impl is None else impl
        if isinstance(impl, str) and impl in self.implementations:
            value = self.implementations[impl]
            if isinstance(value, str) and ":" not in value and self.origin:
                value = f"{self.origin}::{value}" if self.origin.endswith(".py") else f"{self.origin}:{value}"
            return ref_of_callable(value, f"implementations[{impl!r}]")
        if isinstance(impl, str) and ":" not in impl:
            raise TargetError(
                f"impl={impl!r} is not an implementation of target {self.name!r}; "
                f"known: {', '.join(self.implementations)}; or pass 'pkg.mod:func' / 'file.py::NAME'"
            )
        return ref_of_callable(impl, "impl")

    def impl_name(self, impl: Any = None) -> str:
        impl = self.reference if impl is None else impl
        if isinstance(impl, str):
            return impl
        return getattr(impl, "__qualname__", repr(impl))

    def strategy(self, world_sizes: tuple[int, ...] | None = None):
        """The Hypothesis strategy of cases, restricted to ``world_sizes`` when given."""
        from hypothesis.strategies import SearchStrategy

        if isinstance(self.cases, SearchStrategy):
            s = self.cases
            if world_sizes:
                allowed = set(world_sizes)
                s = s.filter(lambda c: c.world_size in allowed)
            return s
        if callable(self.cases):
            return self.cases(world_sizes=world_sizes) if world_sizes else self.cases()
        raise TargetError(f"Target {self.name!r}: cases={self.cases!r} is neither a strategy nor a callable")

    def input_layout(self, name: str) -> Layout:
        return self.input_layouts.get(name, Replicate())

    def worker_ref(self) -> str:
        if not self.origin:
            raise TargetError(
                f"Target {self.name!r} was defined where workers cannot import it (no module file)"
            )
        return f"{self.origin}::{self.name}" if self.origin.endswith(".py") else f"{self.origin}:{self.name}"

    def __repr__(self) -> str:
        return f"Target({self.name!r})"


def resolve_worker_target(ref: str) -> Target:
    """Find a target from :meth:`Target.worker_ref` (used inside workers)."""
    from shardfuzz.registry import get_target

    if "::" in ref:
        return get_target(ref)
    modname, _, name = ref.rpartition(":")
    import importlib

    module = importlib.import_module(modname)
    for v in vars(module).values():
        if isinstance(v, Target) and v.name == name:
            return v
    obj = load_ref(ref, "target")
    if isinstance(obj, Target):
        return obj
    raise TargetError(f"target {ref!r} not found in workers")
