"""Helpers for a target's inputs builder: seeded CPU tensors shaped by the case's value profile.

Inputs are made on CPU with a ``torch.Generator`` seeded from the case, in float32, shaped by the
value profile, then rounded to the case dtype. Every rank and the driver build them the same way
without any collective, so a replay anywhere sees the same data.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import torch

from shardfuzz.case import edge_problem


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


def seed_all(seed: int) -> None:
    """Seed torch's CPU generator, Python's ``random`` and NumPy's global generator with ``seed``, as
    each rank does before it builds the inputs and runs the implementation (the driver's oracle
    then draws what the ranks draw)."""
    seed_global(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))


@dataclasses.dataclass(frozen=True)
class RandomState:
    """The global random states an oracle run starts from (torch's CPU generator, Python's and
    NumPy's): every run of the oracle (float64, the case dtype, the noise samples) starts from the
    same one, so an oracle that draws from a global generator draws the same in each; the case-dtype
    run went on where the float64 run's stream stopped, and their difference widened the bound."""

    torch_state: torch.Tensor
    python: Any
    numpy: Any

    @classmethod
    def now(cls) -> RandomState:
        return cls(torch.get_rng_state(), random.getstate(), np.random.get_state())

    def restore(self) -> None:
        torch.set_rng_state(self.torch_state)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


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
#: ``ties`` quantises the other roles to the midpoints of a grid relative to the tensor's own scale;
#: ``scores``: the input of a softmax itself (the logits a loss is given, attention scores or an
#: additive bias): kept at its scale like ``logits``;
#: ``edge`` writes its value into every role, except ``max``: activations and cotangents, like
#: ``large``, and scores as a finite mask (:func:`edge_value`); never weights or logits (a query of
#: -65504 makes every score huge, not one masked: its gradients cancel past any float32 bound
#: [measured: ring_attention's reference failed 1.19x]).
ROLES = ("activation", "weight", "logits", "cotangent", "scores")


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
    dtype: str | torch.dtype | None = None,
) -> torch.Tensor:
    """Normal values of ``shape`` and standard deviation ``scale`` in the case dtype (or
    ``dtype``: a name, ``"float32"``, or a ``torch.dtype``), shaped by the value profile for a
    tensor of ``role`` (``profile=False``: not at all)."""
    want = _dtype(dtype if dtype is not None else case.dtype)
    g = gen if gen is not None else generator(case)
    t = torch.randn(shape, generator=g, dtype=torch.float32) * scale
    if profile:
        t = apply_profile(t, case, role, scale)
    t = t.to(want)
    return apply_edge(t, case, role) if profile else t


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A floating dtype given by name or as itself (``torch.promote_types(dtype, torch.float32)``, the
    docs' mixed-precision advice, gives a ``torch.dtype``: a new user's target failed on it)."""
    found = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueError(
            f"dtype={dtype!r}; expected a floating dtype, by name ('float32') or as torch.float32"
        )
    return found


#: the ``max`` edge value of each dtype: the largest finite value of the next narrower dtype
NARROWER_MAX = {
    "float64": torch.finfo(torch.float32).max,
    "float32": torch.finfo(torch.float16).max,
    "bfloat16": torch.finfo(torch.float16).max,
    "float16": torch.finfo(torch.float8_e4m3fn).max,
}


#: the ``max`` edge value in scores, as a mask: float16's lowest, what attention masks and vocabulary
#: padding add in half precision (``torch.finfo(torch.float16).min``); float8's in float16 data
MASK = torch.finfo(torch.float16).max


def edge_value(kind: str, exp: int, dtype: torch.dtype, role: str = "activation") -> float:
    """The value the ``edge`` profile writes for ``kind`` (one of :data:`shardfuzz.case.EDGE_KINDS`
    but ``repeat``, which copies a neighbour) and ``exp`` in a tensor of ``dtype`` and ``role``."""
    narrower = NARROWER_MAX[str(dtype).removeprefix("torch.")]
    if kind == "max" and role == "scores":
        # a large score saturates the softmax (see ROLES); a large negative one is a mask: float16's
        # lowest in float64 data too, where float32's would leave no headroom for s - lse
        return -min(narrower, MASK) * 2.0**-exp
    if kind == "max":
        return narrower * 2.0**-exp
    if kind == "subnormal":  # never below the smallest subnormal (bfloat16 has 7 bits of them)
        info = torch.finfo(dtype)
        return max(info.tiny * 2.0 ** -(exp + 1), info.tiny * info.eps)
    if kind == "signed_zero":
        return -0.0
    raise ValueError(f"edge={kind!r}; a value is written for max, subnormal and signed_zero")


def apply_edge(t: torch.Tensor, case: Any, role: str = "activation") -> torch.Tensor:
    """``t`` (already in its dtype, so that the dtype's own subnormals exist) with the ``edge``
    profile's value at slot ``edge_slot`` (modulo the row) of every last-dim row: every rank holds
    the edge at the same index of what it is given. A tensor whose last dim is 1 (2 for ``repeat``)
    is one row, and one of a single element is left alone: the edge never replaces a whole tensor
    (a constant output hides bugs: ``shardfuzz.engine.degenerate``). Other profiles: ``t`` itself."""
    if case.profile != "edge":
        return t
    problem = edge_problem(case.options)
    if problem is not None:
        raise ValueError(f"case.{problem}")
    kind, exp, slot = (case.options[k] for k in ("edge", "edge_exp", "edge_slot"))
    if kind == "max" and role in ("weight", "logits"):
        return t  # a huge weight or query makes everything after it huge (see ROLES)
    if not t.is_floating_point() or t.numel() < 2:
        return t  # the edge would be the whole tensor: a loss scale of -0.0 zeroes every gradient
    # a column is one row; so is a tensor of pairs under ``repeat`` (every pair made equal is constant)
    shortest = 3 if kind == "repeat" else 2
    n = t.shape[-1] if t.ndim and t.shape[-1] >= shortest else t.numel()
    out = t.clone().reshape(-1, n)
    i = slot % n
    out[:, i] = out[:, i - 1] if kind == "repeat" else edge_value(kind, exp, t.dtype, role)
    return out.reshape(t.shape)


def float64(v: Any) -> Any:
    """A floating tensor upcast to float64; anything else as it is."""
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
