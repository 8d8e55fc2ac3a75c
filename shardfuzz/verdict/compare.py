"""The elementwise comparison of the ranks' locals against the oracle, and its description.

An element passes when ``|actual - ref| <= bound`` (the bound: :mod:`shardfuzz.spec.tolerance`).
Integers, bools and non-tensor values are compared exactly. NaN must match NaN, an infinity must
match the same infinity, and a finite reference must be matched by a finite value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass
class RankDiff:
    """The comparison of one rank's local (or of an assembled value) with what it should be."""

    rank: int | None  # None: an assembled (Partial) value
    n: int
    bad: int
    max_abs: float = 0.0
    max_abs_at: tuple = ()
    max_abs_allowed: float = 0.0
    max_rel: float = 0.0
    max_rel_at: tuple = ()
    #: the expected value where the relative difference is greatest (0: it is infinite there)
    max_rel_expected: float = 1.0
    max_ratio: float = 0.0
    #: the greatest differences are NaN (a NaN on one side): ranked as infinite, printed as nan
    max_abs_nan: bool = False
    max_rel_nan: bool = False
    note: str = ""
    #: wrong elements that are not finite where the oracle is, whose noise says the terms summed
    #: into them reach past the dtype's largest finite value (see :func:`compare_tensor`), and the
    #: largest such reach (the noise over the unit roundoff)
    beyond_range: int = 0
    beyond_reach: float = 0.0
    worst: list[ElementDiff] = dataclasses.field(default_factory=list)  # the worst elements, worst first
    # for the map and the plot of a mismatch (shardfuzz.report.mismatch_map, shardfuzz.report.plot): the compared
    # tensor, its mask of wrong elements (None when none is) and its layout's local -> global map
    local: Any = dataclasses.field(default=None, repr=False)
    wrong: Any = dataclasses.field(default=None, repr=False)
    to_global: Callable[[tuple[int, ...]], tuple[int, ...]] | None = dataclasses.field(
        default=None, repr=False
    )
    #: the noise model's estimate over the compared tensor, kept where the piece is wrong (None: a
    #: fixed tolerance, or none drawn): how many low bits a cancellation there leaves at 0
    noise: Any = dataclasses.field(default=None, repr=False)


#: an element at least this many times past its bound gets no cancellation note
CANCELLATION_NOTE_BELOW = 100.0


@dataclasses.dataclass
class ElementDiff:
    """One element of a failing output, for a reader telling a cancellation from a wrong result."""

    index: tuple
    actual: float
    expected: float
    allowed: float
    ratio: float
    noise: float | None = None  # the noise model's estimate (root mean square of the samples)
    terms: float | None = None  # about the magnitude of the terms behind it: noise / u

    def describe(self) -> str:
        text = (
            f"[{', '.join(map(str, self.index))}]: {self.actual:.6g} vs expected {self.expected:.6g}, "
            f"|diff| {abs(self.actual - self.expected):.3g}, allowed {self.allowed:.3g} ({self.ratio:.3g}x)"
        )
        if self.noise is not None:
            text += f"; noise estimate {self.noise:.3g}"
        # near the bound a reader may wonder whether rounding explains it; far past it (a whole
        # contribution missing, 1e4x) the note on every element was only noise
        if self.terms and abs(self.expected) < 0.1 * self.terms and self.ratio < CANCELLATION_NOTE_BELOW:
            text += (
                f"; the expected value is small beside the terms it is made of (about {self.terms:.3g}, "
                f"ratio {abs(self.expected) / self.terms:.2g}): a cancellation, whose rounding is already "
                f"in the allowed difference, so it does not explain this element ({self.ratio:.3g}x past it)"
            )
        return text


@dataclasses.dataclass
class OutputDiff:
    name: str
    layout: str
    dtype: str
    shape: tuple
    ranks: list[RankDiff]
    groups: list[list[int]] = dataclasses.field(default_factory=list)  # world ranks per replica
    ref: Any = dataclasses.field(default=None, repr=False)  # the oracle's global value (float64)
    bound: Any = dataclasses.field(default=None, repr=False)  # the tolerance bound over it
    #: an exactly compared output: where the oracle's noise samples gave another value (global mask)
    flipped: Any = dataclasses.field(default=None, repr=False)
    #: an exactly compared output whose value the oracle's run in the case dtype gives otherwise than
    #: its float64 run: a decision that depends on the dtype (an overflow check in float16)
    dtype_decided: bool = False

    @property
    def bad(self) -> int:
        return sum(r.bad for r in self.ranks)

    @property
    def max_ratio(self) -> float:
        return max((r.max_ratio for r in self.ranks), default=0.0)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def exact_equal(a: Any, b: Any) -> bool:
    if _is_tensor(a) and _is_tensor(b):
        return a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu().to(a.dtype)))
    return a == b


def short_value(v: Any) -> str:
    """A value as a short list or repr (for a report line)."""
    text = repr(v.tolist()) if hasattr(v, "tolist") else repr(v)
    return text if len(text) < 120 else text[:117] + "..."


def compare_exact(rank: int | None, local: Any, want: Any, to_global: Any, what: str) -> RankDiff:
    """``local`` against ``want`` exactly (integers, booleans, anything not floating): every element
    that differs is wrong. Tensors of one shape are counted element by element, with the greatest
    difference and where it is; anything else (another shape, a Python value) is one value."""
    same_shape = (
        isinstance(local, torch.Tensor) and isinstance(want, torch.Tensor) and local.shape == want.shape
    )
    if same_shape:
        a, b = local.cpu(), want.cpu().to(local.dtype)
        wrong = a != b
        n, bad = a.numel(), int(wrong.sum())
    else:
        n, bad = 1, 0 if exact_equal(local, want) else 1
    note = f": {what} {short_value(local)}, expected {short_value(want)}" if bad else ""
    rd = RankDiff(rank, n, bad, max_ratio=math.inf if bad else 0.0, note=note)
    rd.local, rd.to_global = local, to_global
    if same_shape and bad:
        rd.wrong = wrong
        wide = torch.complex128 if a.is_complex() else torch.float64
        diff = (a.to(wide) - b.to(wide)).abs()
        at = int(diff.reshape(-1).argmax())
        rd.max_abs = float(diff.reshape(-1)[at])
        rd.max_abs_at = to_global(tuple(int(k) for k in torch.unravel_index(torch.tensor(at), a.shape)))
    return rd


WORST_SHOWN = 3


def _note_beyond_range(
    rd: RankDiff, overflowed: torch.Tensor, actual: torch.Tensor, noise: torch.Tensor | None, u: float | None
) -> None:
    """Count on ``rd`` the ``overflowed`` elements (not finite where the oracle is) whose terms reach
    past ``actual``'s dtype range. The noise there is about ``u`` times the sum of the absolute
    values of the terms behind the element (less: it adds the roundings in quadrature), so where
    the noise over ``u`` reaches the dtype's largest finite value, those terms do: summed in another
    order than the oracle's (each rank's partial sum, then the all-reduce's), a correct computation
    overflows (a new user's float16 LayerNorm bias gradient: partial sums 50752, -30944, 17152 and
    0, whose total 36960 fits, made inf in gloo's all-reduce)."""
    if noise is None or not u or not actual.is_floating_point() or not bool(overflowed.any()):
        return
    reach = noise.double() / u
    beyond = overflowed & (reach >= torch.finfo(actual.dtype).max)
    rd.beyond_range = int(beyond.sum())
    if rd.beyond_range:
        rd.beyond_reach = float(reach[beyond].max())


def compare_tensor(
    actual: torch.Tensor,
    expected: torch.Tensor,
    bound: torch.Tensor,
    rank: int | None,
    to_global: Callable[[tuple[int, ...]], tuple[int, ...]],
    noise: torch.Tensor | None = None,
    u: float | None = None,
) -> RankDiff:
    """Elementwise comparison with the NaN/Inf policy. ``to_global`` maps a local index to a global
    one; ``noise`` (the noise model's estimate) and ``u`` (the case dtype's unit roundoff) only
    enrich the description of the worst elements."""
    passing = _passing(actual, expected, bound, rank, to_global)
    if passing is not None:
        return passing
    a = actual.detach().double()
    e = expected.double()
    n = e.numel()
    if n == 0:
        return RankDiff(rank, 0, 0, local=actual, to_global=to_global)
    diff = (a - e).abs()
    if bool(torch.isfinite(diff).all()):  # the usual case: no NaN or infinity on either side
        ratio = diff / bound.clamp_min(1e-300)  # a zero bound (atol=rtol=0) allows exactly 0
        wrong = ratio > 1
        rd = RankDiff(rank, n, int(wrong.sum()), local=actual, to_global=to_global)
        rd.max_ratio = float(ratio.max())
        d = diff
        fin_e = ok_nonfinite = None
    else:
        fin_e = torch.isfinite(e)
        ok_nonfinite = (torch.isnan(e) & torch.isnan(a)) | (torch.isinf(e) & (a == e))
        ratio = torch.where(fin_e & (diff != 0), diff / bound, torch.zeros_like(diff))  # 0/0: a match
        ratio = torch.where(fin_e & ~torch.isfinite(a), torch.full_like(diff, math.inf), ratio)
        ratio = torch.where(~fin_e & ~ok_nonfinite, torch.full_like(diff, math.inf), ratio)
        ratio = ratio.nan_to_num(nan=math.inf, posinf=math.inf)
        wrong = ratio > 1
        rd = RankDiff(rank, n, int(wrong.sum()), local=actual, to_global=to_global)
        rd.max_ratio = float(ratio.max())
        _note_beyond_range(rd, wrong & fin_e & ~torch.isfinite(a), actual, noise, u)
        d = torch.where(
            fin_e, diff.nan_to_num(nan=math.inf, posinf=math.inf), torch.where(ok_nonfinite, 0.0, math.inf)
        )
    # a NaN on one side only (both NaN is a match): ranked as infinitely wrong, printed as nan
    one_nan = None if fin_e is None else torch.isnan(a) ^ torch.isnan(e)
    i = int(d.argmax())
    rd.max_abs = float(d.flatten()[i])
    rd.max_abs_nan = one_nan is not None and bool(one_nan.flatten()[i])
    rd.max_abs_at = to_global(tuple(int(v) for v in _unravel(i, e.shape)))
    rd.max_abs_allowed = float(bound.flatten()[i])
    if not rd.bad:  # a passing piece is described by its worst ratio and its largest difference
        return rd
    rd.wrong, rd.noise = wrong, noise
    # where the expected value is 0, any difference is infinitely large relative to it (dividing
    # by a clamp printed "1.25e+299")
    rel = torch.where(e != 0, d / e.abs(), torch.where(d > 0, math.inf, 0.0))
    if fin_e is not None:  # a non-finite expected value: 0 where matched (NaN and NaN), else inf
        rel = torch.where(fin_e, rel, d)
    j = int(rel.argmax())
    rd.max_rel = float(rel.flatten()[j])
    rd.max_rel_nan = one_nan is not None and bool(one_nan.flatten()[j])
    rd.max_rel_at = to_global(tuple(int(v) for v in _unravel(j, e.shape)))
    rd.max_rel_expected = float(e.flatten()[j])
    if rd.bad:
        flat_ratio, flat_a, flat_e, flat_b = ratio.flatten(), a.flatten(), e.flatten(), bound.flatten()
        order = torch.argsort(flat_ratio, descending=True)[: min(WORST_SHOWN, rd.bad)]
        for k in (int(v) for v in order):
            sigma = float(noise.flatten()[k]) if noise is not None else None
            rd.worst.append(
                ElementDiff(
                    to_global(tuple(int(v) for v in _unravel(k, e.shape))),
                    float(flat_a[k]),
                    float(flat_e[k]),
                    float(flat_b[k]),
                    float(flat_ratio[k]),
                    sigma,
                    sigma / u if sigma is not None and u else None,
                )
            )
    return rd


def _passing(
    actual: torch.Tensor,
    expected: torch.Tensor,
    bound: torch.Tensor,
    rank: int | None,
    to_global: Callable[[tuple[int, ...]], tuple[int, ...]],
) -> RankDiff | None:
    """The usual case, a piece that passes with finite values on both sides, in numpy: the same
    float64 arithmetic as :func:`compare_tensor`'s, at a third of its cost (a dozen small ops, each
    ~2 us in torch's dispatcher, on ~18 pieces an example); None for anything else, which
    :func:`compare_tensor` then describes."""
    if not (
        actual.is_floating_point()
        and expected.is_floating_point()
        and bound.is_floating_point()
        and actual.device.type == expected.device.type == bound.device.type == "cpu"
        and actual.shape == expected.shape == bound.shape
        and expected.numel() > 0
    ):
        return None
    a = actual.detach().double().numpy()
    e = expected.detach().double().numpy()
    b = bound.detach().double().numpy()
    with np.errstate(all="ignore"):  # inf - inf, an overflow: torch's arithmetic does not warn either
        diff = np.abs(a - e)
        if not np.isfinite(diff).all():
            return None
        ratio = diff / np.maximum(b, 1e-300)  # a zero bound (atol=rtol=0) allows exactly 0
    worst = float(ratio.max())
    if not worst <= 1:  # a wrong element (or a NaN bound): compare_tensor describes it
        return None
    rd = RankDiff(rank, diff.size, 0, local=actual, to_global=to_global, max_ratio=worst)
    i = int(diff.argmax())
    rd.max_abs = float(diff.reshape(-1)[i])
    rd.max_abs_at = to_global(tuple(int(v) for v in _unravel(i, e.shape)))
    rd.max_abs_allowed = float(b.reshape(-1)[i])
    return rd


def _unravel(i: int, shape: Iterable[int]) -> list[int]:
    out = []
    for s in reversed(tuple(shape)):
        out.append(i % s if s else 0)
        i = i // s if s else 0
    return list(reversed(out))
