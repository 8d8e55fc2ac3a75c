"""Helpers for a target's inputs builder: seeded CPU tensors shaped by the case's value profile.

Inputs are made on CPU with a ``torch.Generator`` seeded from the case, in float32, shaped by the
value profile, then rounded to the case dtype. Every rank and the driver build them the same way
without any collective, so a replay anywhere sees the same data.
"""

from __future__ import annotations

from typing import Any

import torch


def generator(case: Any, stream: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` for ``case.seed`` (``stream`` gives independent sub-streams)."""
    return torch.Generator(device="cpu").manual_seed((case.seed * 1_000_003 + stream) % (2**63))


def seed_global(seed: int, device_type: str = "cpu") -> None:
    """Seed torch's global RNG for an example run on ``device_type``. On the CPU only the CPU's
    generator: ``torch.manual_seed`` also queues a seed for every accelerator not yet initialised
    (CUDA, XPU, MTIA), each with a formatted stack (``traceback.format_stack``, 2-7 ms per example
    on 2 cores), for RNGs that a CPU example never draws from."""
    if device_type == "cpu":
        torch.default_generator.manual_seed(int(seed))
    else:
        torch.manual_seed(seed)


#: what a tensor is to the value profile (``role=`` of :func:`randn`):
#: ``activation``: inputs, activations, loss scales and cotangents: ``large``/``small`` scale them;
#: ``weight``: weights, biases, embedding tables: they keep their init scale (a large weight makes
#: every activation after it large, saturating what follows: a GELU input far below 0 is exactly 0);
#: ``logits``: a tensor that feeds a softmax (queries, keys, router inputs): ``large`` logits make
#: the softmax one-hot, which hides bugs (zero-padded keys get weight 0); test large logit gaps on
#: purpose with a target option (``ring_attention``'s ``logit_scale``);
#: ``cotangent``: the gradient fed to backward, a loss scale: ``large``/``small`` scale it, ``ties``
#: leaves it (a few values on a coarse grid are often all 0, and a zero cotangent zeroes every
#: gradient).
#: ``ties`` quantises the other roles to the midpoints of a grid relative to the tensor's own scale.
ROLES = ("activation", "weight", "logits", "cotangent")


def apply_profile(t: torch.Tensor, case: Any, role: str = "activation", scale: float = 1.0) -> torch.Tensor:
    """Shape float32 values ``t`` (of standard deviation ``scale``) by ``case.profile`` for a tensor
    of ``role`` (see :data:`ROLES` and :data:`shardfuzz.strategies.PROFILES`)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}; allowed: {', '.join(ROLES)}")
    opts = case.options
    if case.profile in ("large", "small"):
        return t * float(opts.get("scale", 1.0)) if role in ("activation", "cotangent") else t
    if case.profile == "ties" and role != "cotangent":
        # the midpoints of a coarse grid: many exactly equal values, and never a 0 (a few values
        # rounded to 0 on a coarse grid are often all 0, and every output after them with them)
        grid = float(opts.get("grid", 0.5)) * scale
        return ((t / grid).floor() + 0.5) * grid
    return t


def randn(
    case: Any,
    *shape: int,
    gen: torch.Generator | None = None,
    scale: float = 1.0,
    profile: bool = True,
    role: str = "activation",
    dtype: str | None = None,
) -> torch.Tensor:
    """Normal values of ``shape`` and standard deviation ``scale`` in the case dtype (or
    ``dtype``), shaped by the value profile for a tensor of ``role`` (``profile=False``: not at all)."""
    g = gen if gen is not None else generator(case)
    t = torch.randn(shape, generator=g, dtype=torch.float32) * scale
    if profile:
        t = apply_profile(t, case, role, scale)
    return t.to(getattr(torch, dtype or case.dtype))


def float64(v: Any) -> Any:
    """A floating tensor upcast to float64; anything else as it is."""
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
