"""Helpers for a target's inputs builder: seeded CPU tensors shaped by the case's value profile.

Inputs are made on CPU with a ``torch.Generator`` seeded from the case, in float32, shaped by the
value profile, then rounded to the case dtype. Every rank and the driver build them the same way
without any collective, so a replay anywhere sees the same data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def generator(case: Any, stream: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` for ``case.seed`` (``stream`` gives independent sub-streams)."""
    import torch

    return torch.Generator(device="cpu").manual_seed((case.seed * 1_000_003 + stream) % (2**63))


def apply_profile(t: torch.Tensor, case: Any) -> torch.Tensor:
    """Shape float32 values ``t`` by ``case.profile`` (see :data:`shardfuzz.strategies.PROFILES`)."""
    opts = case.options
    if case.profile == "large" or case.profile == "small":
        return t * float(opts.get("scale", 1.0))
    if case.profile == "ties":
        grid = float(opts.get("grid", 0.5))
        return (t / grid).round() * grid
    return t


def randn(
    case: Any,
    *shape: int,
    gen: torch.Generator | None = None,
    scale: float = 1.0,
    profile: bool = True,
    dtype: str | None = None,
) -> torch.Tensor:
    """Normal values of ``shape`` in the case dtype (or ``dtype``), after the value profile."""
    import torch

    g = gen if gen is not None else generator(case)
    t = torch.randn(*shape, generator=g, dtype=torch.float32) * scale
    if profile:
        t = apply_profile(t, case)
    return t.to(getattr(torch, dtype or case.dtype))
