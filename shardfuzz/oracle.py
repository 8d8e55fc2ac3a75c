"""The oracle of one case: the single-process result in float64 (the reference) and once more in
the case dtype (to measure that dtype's rounding noise on this very case), plus the target's
magnitude estimate when it gives one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardfuzz.case import Case
from shardfuzz.errors import ShardfuzzError


@dataclasses.dataclass
class Expected:
    """What the oracle says a case must give."""

    ref: dict[str, Any]  # float64 on the rounded inputs
    low: dict[str, Any]  # in the case dtype
    mag: dict[str, Any]  # the target's magnitudes (empty without one)
    inputs: dict[str, Any]  # the full inputs as built (failure files hash them)


def evaluate_oracle(target: Any, case: Case, outputs: dict[str, Any] | None = None) -> Expected:
    """Run ``target``'s oracle on ``case``; ``outputs`` (name -> layout) defaults to the case's."""
    import torch

    torch.manual_seed(case.seed)
    inputs = target.inputs(case)
    if not isinstance(inputs, dict):
        raise ShardfuzzError(
            f"target {target.name!r}: inputs(case) returned {type(inputs).__name__}, not a dict"
        )
    inputs64 = {
        k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in inputs.items()
    }
    with torch.enable_grad():
        ref = target.oracle(inputs64, case)
        low = target.oracle(
            {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}, case
        )
        mag = target.magnitude(inputs64, case) if target.magnitude else {}
    wanted = outputs if outputs is not None else target.outputs_for(case)
    missing = set(wanted) - set(ref)
    if missing:
        raise ShardfuzzError(f"target {target.name!r}: the oracle returned no {sorted(missing)}")

    def detach(d: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}

    return Expected(detach(ref), detach(low), detach(mag), inputs)
