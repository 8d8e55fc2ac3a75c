"""The judge: the ranks' locals against the oracle, layouts first, then values.

It decides and describes; it never raises. :mod:`shardfuzz.report.findings` turns a failing
:class:`Verdict` into a finding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from shardfuzz.case import Case
from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.layouts import Layout, Owned
from shardfuzz.spec.placements import resolve as resolve_dtensors
from shardfuzz.spec.tolerance import UNIT_ROUNDOFF, Tolerance
from shardfuzz.verdict.compare import OutputDiff, RankDiff, compare_exact, compare_tensor, exact_equal
from shardfuzz.verdict.oracle import Expected


@dataclasses.dataclass
class Verdict:
    """The judgement of one example. It passes when nothing below is set or bad."""

    ignored: dict[int, list[str]] = dataclasses.field(default_factory=dict)  # rank -> warnings
    layout_problems: list[str] = dataclasses.field(default_factory=list)
    diffs: list[OutputDiff] = dataclasses.field(default_factory=list)
    worst: float = 0.0  # the largest error/tolerance over every compared element
    #: ``worst`` was judged without the noise term (a sure pass: shardfuzz.verdict.decide), so it
    #: is an upper bound on the ratio with it
    upper_bound: bool = False
    #: the oracle's ops its noise samples gave one rounding of their result (sorted)
    unmodelled: tuple[str, ...] = ()

    @property
    def mismatched(self) -> list[OutputDiff]:
        return [d for d in self.diffs if d.bad]

    @property
    def passed(self) -> bool:
        return not (self.ignored or self.layout_problems or self.mismatched)


#: what a layout problem of the dtype alone adds: a new user's FSDP2 MLP built its nn.Linear without
#: ``dtype=``, so float64 cases held float32 parameters, and the report's 1-rank note sent them to
#: the math
DTYPE_ONLY = (
    ": the shape is right, the dtype is not (a module or tensor made in a fixed dtype, such as "
    "nn.Linear or torch.zeros without dtype=, where the oracle's follows the inputs: make it in "
    "ctx.dtype or an input's dtype; or, where the implementation's dtype is the one meant, as "
    "float32 master weights or optimizer state in a 16-bit step are, the oracle returns another: "
    "keep it there too, e.g. torch.promote_types(x.dtype, torch.float32))"
)


def judge(
    case: Case,
    outputs: dict[str, Layout],
    locals_: list[dict[str, Any]],
    expected: Expected,
    tolerance: Tolerance,
    ignored: dict[int, list[str]] | None = None,
) -> Verdict:
    """Judge the decoded locals of every rank (``locals_[rank]``) against ``expected``."""
    if ignored:
        return Verdict(ignored=ignored)
    outputs, locals_, problems = resolve_dtensors(case, outputs, locals_, expected.ref)
    if problems:
        return Verdict(layout_problems=problems)
    problems = check_layouts(case, outputs, locals_, expected)
    if problems:
        return Verdict(layout_problems=problems)
    diffs = compare_values(case, outputs, locals_, expected, tolerance)
    return Verdict(
        diffs=diffs,
        worst=max((d.max_ratio for d in diffs), default=0.0),
        unmodelled=tuple(sorted(expected.unmodelled)),
    )


#: the end of a problem line where a rank returned None and the oracle has a tensor
RETURNED_NONE = "(None: never computed)"
#: said once under such lines: two new users' raw all_to_all_single into a new buffer (no backward)
#: cut the graph, and their gradients came back None with only the first sentence, which read as
#: being about experts without tokens
NEVER_COMPUTED = (
    "None: a gradient never computed is not a zero one (an optimizer skips the parameter: no weight "
    "decay, no momentum). Where autograd should have reached it, something cut the graph before it: "
    "a raw torch.distributed collective into a new buffer (it has no backward: wrap it in an "
    "autograd.Function, e.g. shardfuzz.spec.parallel's AllToAll or GatherSequence), a .detach() or "
    "torch.no_grad()"
)


def _not_a_tensor(layout: Layout, got: Any, ref: torch.Tensor, low: Any, group_rank: int, group: int) -> str:
    """What a rank (``group_rank`` of a group of ``group``) returned in place of a tensor, and what
    was due. The named owner of an ``Owned`` output that returns None never computed it."""
    owner = isinstance(layout, Owned) and layout.rank is not None and group_rank == layout.rank % group
    if got is None and isinstance(layout, Owned) and not owner:  # "not mine", not a graph cut
        return (
            f"None; {layout!r} wants the oracle's global value {list(ref.shape)} on its owner and an "
            "empty tensor, torch.empty(0), on every other rank"
        )
    # None where the oracle has a value is the implementation's to answer for (a gradient never
    # computed, for an expert that got no tokens), not a usage error
    never = f" {RETURNED_NONE}" if got is None else ""
    # the global value: this rank's piece needs its own shape, which None has not
    return f"{_what(got)}, expected a tensor (the oracle's global value is {list(ref.shape)} {_dtype_name(low)}){never}"


def check_layouts(
    case: Case, outputs: dict[str, Layout], locals_: list[dict[str, Any]], expected: Expected
) -> list[str]:
    """Every rank holds every output, with the shape and dtype its layout says. An output the
    target does not declare is not compared, as an oracle's is not (a new user's block returned
    every gradient and declared a few: a layout finding, with a one-rank diagnosis)."""
    label = case.rank_label
    declared = set(outputs)
    problems = [
        f"{label(r)} returned outputs {sorted(out)}, without {sorted(declared - set(out))}; the target "
        f"declares {sorted(declared)}"
        for r, out in enumerate(locals_)
        if declared - set(out)
    ]
    if problems:
        return problems
    g = case.group_size
    for name, layout in outputs.items():
        ref, low = expected.ref[name], expected.low[name]
        before = len(problems)
        for r, out in enumerate(locals_):
            got = out[name]
            if not isinstance(ref, torch.Tensor):
                if isinstance(got, torch.Tensor) or (got is None) != (ref is None):
                    problems.append(
                        f"output {name!r}: {label(r)} returned {_what(got)}, the oracle gives {_what(ref)}"
                    )
                continue
            if not isinstance(got, torch.Tensor):
                problems.append(
                    f"output {name!r}: {label(r)} returned {_not_a_tensor(layout, got, ref, low, layout.index_of(r, g), g)}"
                )
                continue
            try:
                want_shape = layout.expected_shape(
                    tuple(got.shape), tuple(ref.shape), layout.index_of(r, g), g
                )
            except InvalidArgument as e:  # the layout cannot lay out the oracle's value (Shard's blocks)
                raise InvalidArgument(f"output {name!r}: {e}") from None
            if tuple(got.shape) != want_shape or got.dtype != low.dtype:
                problems.append(
                    f"output {name!r} ({layout!r}): {label(r)} holds "
                    f"{list(got.shape)} {_dtype_name(got)}, expected "
                    f"{list(want_shape)} {_dtype_name(low)} (global {list(ref.shape)} over {g} ranks)"
                    + (DTYPE_ONLY if tuple(got.shape) == want_shape else "")
                )
        if isinstance(ref, torch.Tensor) and len(problems) == before:
            for replica in layout.replicas(case):
                msg = layout.check_group([tuple(locals_[r][name].shape) for r in replica], tuple(ref.shape))
                if msg:
                    problems.append(f"output {name!r} ({layout!r}), ranks {replica}: {msg}")
    return problems


def compare_values(
    case: Case,
    outputs: dict[str, Layout],
    locals_: list[dict[str, Any]],
    expected: Expected,
    tolerance: Tolerance,
) -> list[OutputDiff]:
    """One :class:`OutputDiff` per output: floating values within the tolerance, others exactly."""
    diffs = []
    for name, layout in outputs.items():
        ref, low = expected.ref[name], expected.low[name]
        floating = isinstance(ref, torch.Tensor) and (ref.is_floating_point() or ref.is_complex())
        if ref is None:  # "no value" (an unused gradient): every rank returned None too (check_layouts)
            diffs.append(OutputDiff(name, repr(layout), "None", (), []))
            continue
        if floating:
            fixed = tolerance.for_output(name)
            if fixed is not None:
                bound = fixed.bound(ref.double())
            else:
                bound = tolerance.bound(
                    ref,
                    low,
                    expected.noise.get(name),
                    expected.mag.get(name),
                    tolerance.judged_dtype(case.dtype),
                    case.group_size,
                    expected.case_scale,
                )
            noise = expected.noise.get(name) if fixed is None else None
            u = UNIT_ROUNDOFF[tolerance.judged_dtype(case.dtype)]
            rds = _compare_floating(case, layout, [out[name] for out in locals_], ref, bound, noise, u)
            dtype = _dtype_name(low)
        else:
            if name in dict(tolerance.per_output):  # its own, by name (a pattern may match it by chance)
                # a new user's --tolerance skipped=atol:5 on an int64 flag was printed as applied,
                # and the flag still failed at a difference of 1
                raise InvalidArgument(
                    f"a tolerance for output {name!r} (--tolerance, Tolerance(per_output=...)), which is "
                    f"compared exactly: the oracle gives it as {_dtype_name(ref)}, not a floating tensor; "
                    "a tolerance applies to floating outputs only"
                )
            rds, bound = _compare_exact(case, layout, [out[name] for out in locals_], ref), None
            dtype = _dtype_name(ref)
        groups = layout.replicas(case) if layout.per_rank else []
        shape = tuple(getattr(ref, "shape", ()))
        flipped = None if floating else expected.flipped.get(name)
        # looked at only where the output is wrong: only a mismatch's report says it
        decided = not floating and any(r.bad for r in rds) and isinstance(ref, torch.Tensor)
        decided = decided and isinstance(low, torch.Tensor) and not exact_equal(ref, low)
        diffs.append(OutputDiff(name, repr(layout), dtype, shape, rds, groups, ref, bound, flipped, decided))
    return diffs


def _compare_floating(
    case: Case, layout: Layout, got: list[Any], ref: Any, bound: Any, noise: Any, u: float
) -> list[RankDiff]:
    g, shape = case.group_size, tuple(ref.shape)
    if not layout.per_rank:
        return [
            compare_tensor(
                layout.assemble_at(replica, [got[r] for r in replica]),
                ref,
                bound,
                None,
                lambda idx: idx,
                noise,
                u,
            )
            for replica in layout.replicas(case)
        ]
    rds = []
    for r, local in enumerate(got):
        if not layout.holds_piece(tuple(local.shape), shape):
            continue
        i = layout.index_of(r, g)
        to_global = lambda idx, i=i: layout.global_index(idx, i, g, shape)
        rds.append(
            compare_tensor(
                layout.comparable(local, i, g, shape),
                layout.piece(ref, i, g),
                layout.piece(bound, i, g),
                r,
                to_global,
                None if noise is None else layout.piece(noise, i, g),
                u,
            )
        )
    return rds


def _compare_exact(case: Case, layout: Layout, got: list[Any], ref: Any) -> list[RankDiff]:
    g = case.group_size
    rds = []
    if layout.per_rank:
        for r, local in enumerate(got):
            if not layout.holds_piece(tuple(getattr(local, "shape", ())), tuple(getattr(ref, "shape", ()))):
                continue
            i = layout.index_of(r, g)
            want = layout.piece(ref, i, g) if isinstance(ref, torch.Tensor) else ref
            shape = tuple(ref.shape) if isinstance(ref, torch.Tensor) else ()
            if isinstance(ref, torch.Tensor) and isinstance(local, torch.Tensor):
                local = layout.comparable(local, i, g, shape)  # padding is not compared, as for floats

            def to_global(idx: tuple, i: int = i, shape: tuple = shape) -> tuple:
                return layout.global_index(idx, i, g, shape) if shape else idx

            rds.append(compare_exact(r, local, want, to_global, "got"))
        return rds
    for replica in layout.replicas(case):
        total = layout.assemble_at(replica, [got[r] for r in replica])
        rds.append(compare_exact(None, total.to(ref.dtype), ref, lambda idx: idx, "sum"))
    return rds


def _what(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, torch.Tensor):
        return f"a tensor {list(v.shape)} {_dtype_name(v)}"
    kind = f"{type(v).__module__.split('.')[0]}.{type(v).__name__}".removeprefix("builtins.")
    if hasattr(v, "shape") and hasattr(v, "dtype"):  # a numpy array: not a tensor, whatever it holds
        return f"{_a(kind)} {list(v.shape)} {_dtype_name(v)}"
    return _a(kind)


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _dtype_name(v: Any) -> str:
    return str(getattr(v, "dtype", type(v).__name__)).removeprefix("torch.")
