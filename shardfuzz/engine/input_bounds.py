"""How large a hand-made case's inputs would be, measured before any of them is allocated.

A failure file (or ``shardfuzz case``) can carry any sizes; a crafted one with huge sizes would be
refused only after the allocator failed on the driver and every rank. :func:`check_input_size` runs
the target's ``inputs(case)`` under torch's ``FakeTensorMode`` (tensors with shapes and dtypes but
no storage) and refuses a case whose inputs exceed :data:`MAX_INPUT_ELEMENTS` or
:data:`MAX_INPUT_BYTES`, naming the sizes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from shardfuzz.errors import InvalidArgument
from shardfuzz.limits import env_int

#: the most elements and bytes a case's inputs may hold together (every rank and the driver build
#: them all, the oracle again in float64); ``$SHARDFUZZ_MAX_INPUT_BYTES`` raises the byte limit
MAX_INPUT_ELEMENTS = 2**27
MAX_INPUT_BYTES = 2**30
#: when the inputs cannot be measured (a builder that reads values back), each size must stay below
#: this and their product below MAX_INPUT_ELEMENTS
MAX_UNMEASURED_SIZE = 2**16


def max_input_bytes() -> int:
    return env_int("SHARDFUZZ_MAX_INPUT_BYTES", MAX_INPUT_BYTES, 1)


def measure_inputs(target: Any, case: Any) -> tuple[int, int] | None:
    """(elements, bytes) of ``target.inputs(case)``, built without storage; None when the builder
    cannot run on fake tensors (it reads values back, or raises: the real build reports that)."""
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            inputs = target.inputs(case)
    except RuntimeError as e:
        if "overflow" in str(e):  # a shape whose byte size does not fit in 64 bits
            return (2**63, 2**63)
        return None
    except Exception:  # noqa: BLE001 (the target's own error, or one of fake tensors: the real build reports it)
        return None
    tensors = [
        v for v in (inputs.values() if isinstance(inputs, dict) else ()) if isinstance(v, torch.Tensor)
    ]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def check_input_size(target: Any, case: Any, where: str = "case") -> None:
    """InvalidArgument when ``case``'s inputs would be over the limits (before they are built)."""
    limit_bytes = max_input_bytes()
    sizes = ", ".join(f"{k}={v}" for k, v in case.sizes.items())
    measured = measure_inputs(target, case)
    if measured is None:
        big = {k: v for k, v in case.sizes.items() if v > MAX_UNMEASURED_SIZE}
        if big or math.prod(case.sizes.values()) > MAX_INPUT_ELEMENTS:
            raise InvalidArgument(
                f"{where}: sizes {sizes} are too large to build (each at most {MAX_UNMEASURED_SIZE}, "
                f"their product at most {MAX_INPUT_ELEMENTS}, when the inputs cannot be measured first)"
            )
        return
    elements, nbytes = measured
    if elements > MAX_INPUT_ELEMENTS or nbytes > limit_bytes:
        raise InvalidArgument(
            f"{where}: sizes {sizes} give inputs of {elements} elements ({nbytes} bytes), over the limit of "
            f"{MAX_INPUT_ELEMENTS} elements and {limit_bytes} bytes ($SHARDFUZZ_MAX_INPUT_BYTES); refused "
            "before building them"
        )
