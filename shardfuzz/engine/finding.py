"""The finding context: everything about one finding that is not its report text, built once by
the runner when the finding is raised and handed, frozen, to every hook
(:meth:`~shardfuzz.engine.hooks.RunHooks.on_finding`) and kept on the finding (``Finding.context``).

Hooks (the failure-file recorder, a campaign's bookkeeping) read what they need here, never the
runner's attributes, so a finding's failure file describes the example that raised it even when the
runner has run others since.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from shardfuzz.case import Case
from shardfuzz.engine.config import RunConfig
from shardfuzz.protocol import ImplRef
from shardfuzz.spec.tolerance import Tolerance


@dataclasses.dataclass(frozen=True)
class FindingContext:
    """One finding's example: what ran, where, on which inputs, and what it left behind."""

    case: Case
    target: str  # the target's name
    target_ref: str  # a reference that finds the target again from any folder (rerun lines, replay)
    worker_ref: str  # how the ranks import the target
    impl: str  # the implementation's name
    impl_ref: ImplRef
    backend: str
    device: str
    config: RunConfig
    tolerance: Tolerance  # the run's: the target's per-output overrides, then the run's own on top
    inputs_sha256: str  # :func:`inputs_hash` of the case's full inputs (failure files check them)
    numerics: Mapping[str, Any] | None  # rank 0's numerics flags (of the run's first example)
    traces: Mapping[int, tuple]  # global rank -> the collectives it entered
    leaks: tuple[str, ...]  # global state the example left behind (restored or the pool restarted)
    planted: bool = False  # the implementation is one of the target's planted bugs


def inputs_hash(inputs: Mapping[str, Any]) -> str:
    """sha256 over every input's name, dtype, shape and bytes (bf16 as its bits)."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        v = inputs[name]
        h.update(name.encode())
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            h.update(t.numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()
