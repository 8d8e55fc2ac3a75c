"""Comparison of the ranks' locals against the oracle, and the tolerance policy.

Tolerance policy (see the README for the measurements behind it):

* the oracle runs in float64 on the *same rounded inputs* the ranks got (the reference), and once
  more in the case dtype, to measure the rounding noise of that dtype on this very case;
* an element passes when ``|actual - ref| <= bound`` with

  ``bound = noise_factor * |oracle_case_dtype - ref| + magnitude_factor * (2 + W) * u * mag``

  where ``u`` is the unit roundoff of the case dtype (2^-24 fp32, 2^-8 bf16, 2^-53 fp64), ``W`` the
  group size, and ``mag`` the target's elementwise magnitude estimate (e.g. ``|x| @ |w|``) when it
  gives one, else ``|ref| + rms(ref)``;
* integers, bools and non-tensor values are compared exactly;
* NaN must match NaN, an infinity must match the same infinity, and a finite reference must be
  matched by a finite value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The tolerance policy; the defaults are what the built-in targets were tuned with."""

    noise_factor: float = 4.0
    magnitude_factor: float = 4.0

    def describe(self) -> str:
        return (
            f"|actual - oracle64| <= {self.noise_factor:g} * |oracle_in_case_dtype - oracle64| "
            f"+ {self.magnitude_factor:g} * (2 + W) * u * magnitude"
        )

    def bound(
        self, ref: torch.Tensor, low: torch.Tensor, mag: torch.Tensor | None, dtype: str, group_size: int
    ) -> torch.Tensor:
        import torch

        u = UNIT_ROUNDOFF[dtype]
        noise = (low.double() - ref).abs()
        noise = torch.where(torch.isfinite(noise), noise, torch.zeros_like(noise))
        if mag is None:
            finite = ref[torch.isfinite(ref)]
            rms = float(finite.pow(2).mean().sqrt()) if finite.numel() else 0.0
            mag = ref.abs().nan_to_num(0.0, 0.0, 0.0) + rms
        else:
            mag = mag.double().abs()
        tiny = float(torch.finfo(getattr(torch, dtype)).tiny)
        return self.noise_factor * noise + self.magnitude_factor * (2 + group_size) * u * mag + tiny


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
    max_ratio: float = 0.0
    note: str = ""


@dataclasses.dataclass
class OutputDiff:
    name: str
    layout: str
    dtype: str
    shape: tuple
    ranks: list[RankDiff]

    @property
    def bad(self) -> int:
        return sum(r.bad for r in self.ranks)

    @property
    def max_ratio(self) -> float:
        return max((r.max_ratio for r in self.ranks), default=0.0)


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def exact_equal(a: Any, b: Any) -> bool:
    import torch

    if _is_tensor(a) and _is_tensor(b):
        return a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu().to(a.dtype)))
    return a == b


def compare_tensor(
    actual: torch.Tensor,
    expected: torch.Tensor,
    bound: torch.Tensor,
    rank: int | None,
    to_global: Callable[[tuple[int, ...]], tuple[int, ...]],
) -> RankDiff:
    """Elementwise comparison with the NaN/Inf policy. ``to_global`` maps a local index to a global one."""
    import torch

    a = actual.detach().double()
    e = expected.double()
    n = e.numel()
    if n == 0:
        return RankDiff(rank, 0, 0)
    diff = (a - e).abs()
    fin_e = torch.isfinite(e)
    ok_nonfinite = (torch.isnan(e) & torch.isnan(a)) | (torch.isinf(e) & (a == e))
    ratio = torch.where(fin_e, diff / bound, torch.zeros_like(diff))
    ratio = torch.where(fin_e & ~torch.isfinite(a), torch.full_like(diff, math.inf), ratio)
    ratio = torch.where(~fin_e & ~ok_nonfinite, torch.full_like(diff, math.inf), ratio)
    ratio = ratio.nan_to_num(nan=math.inf, posinf=math.inf)
    bad_mask = ratio > 1
    rd = RankDiff(rank, n, int(bad_mask.sum()))
    rd.max_ratio = float(ratio.max())
    d = torch.where(
        fin_e, diff.nan_to_num(nan=math.inf, posinf=math.inf), torch.where(ok_nonfinite, 0.0, math.inf)
    )
    i = int(d.argmax())
    rd.max_abs = float(d.flatten()[i])
    rd.max_abs_at = to_global(tuple(int(v) for v in _unravel(i, e.shape)))
    rd.max_abs_allowed = float(bound.flatten()[i])
    rel = d / e.abs().clamp_min(1e-300)
    j = int(rel.argmax())
    rd.max_rel = float(rel.flatten()[j])
    rd.max_rel_at = to_global(tuple(int(v) for v in _unravel(j, e.shape)))
    return rd


def _unravel(i: int, shape: Iterable[int]) -> list[int]:
    out = []
    for s in reversed(tuple(shape)):
        out.append(i % s if s else 0)
        i = i // s if s else 0
    return list(reversed(out))


def format_output_diff(od: OutputDiff, rank_label: Callable[[int], str]) -> str:
    lines = []
    total = sum(r.n for r in od.ranks)
    bad_ranks = [r for r in od.ranks if r.bad]
    pct = 100.0 * od.bad / total if total else 0.0
    lines.append(
        f"output {od.name!r} ({od.layout}, {od.dtype}, global shape {list(od.shape)}): "
        f"mismatched elements: {od.bad} / {total} ({pct:.1f}%), on "
        + (
            f"{len(bad_ranks)} of {len(od.ranks)} ranks"
            if od.ranks[0].rank is not None
            else "the sum over ranks"
        )
    )
    for r in od.ranks:
        who = rank_label(r.rank) if r.rank is not None else "sum over ranks"
        if not r.bad:
            lines.append(f"  {who}: ok (worst error/tolerance {r.max_ratio:.3g})")
            continue
        lines.append(f"  {who}: {r.bad} / {r.n} elements wrong{r.note}")
        lines.append(
            f"    greatest absolute difference: {r.max_abs:.6g} at index {r.max_abs_at} "
            f"(up to {r.max_abs_allowed:.3g} allowed, {r.max_ratio:.3g}x the tolerance at worst)"
        )
        lines.append(f"    greatest relative difference: {r.max_rel:.6g} at index {r.max_rel_at}")
    return "\n".join(lines)
