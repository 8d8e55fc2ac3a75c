"""What can run where on GPUs, and clear refusals for what cannot.

* ``nccl`` needs one CUDA device per rank: NCCL 2.5+ refuses two ranks on one GPU ("Duplicate GPU
  detected", NVIDIA/nccl#418). With N GPUs, nccl runs world sizes up to N.
* ``gloo`` on CUDA tensors supports only ``broadcast`` and ``all_reduce`` (the torch.distributed
  backend table), so several ranks can share one GPU only for targets that use nothing else; a
  target says which collectives it uses with ``Target(collectives=...)``.
* Inputs are always built on the CPU from the seed, then moved, so a replay sees the same data.
"""

from __future__ import annotations

from typing import Any

import torch

from shardfuzz.errors import InfrastructureError, InvalidArgument
from shardfuzz.spec.registry import available_targets, get_target

GLOO_CUDA_COLLECTIVES = frozenset({"all_reduce", "broadcast"})


def cuda_device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def placement_summary(targets: list[Any] | None = None, n_gpus: int | None = None) -> str:
    """Which targets and world sizes can run on this machine's GPUs."""
    n = cuda_device_count() if n_gpus is None else n_gpus
    targets = targets or [get_target(name) for name in sorted(available_targets())]
    lines = [f"{n} CUDA device(s) visible."]
    lines.append(
        f"  nccl: every target, world sizes 1..{n}"
        if n
        else "  nccl: nothing (needs one CUDA device per rank)"
    )
    ok = [
        t.name for t in targets if t.collectives is not None and set(t.collectives) <= GLOO_CUDA_COLLECTIVES
    ]
    if n:
        lines.append(
            "  gloo on CUDA tensors (ranks may share a GPU): "
            + (
                ", ".join(ok) + " (only all_reduce/broadcast)"
                if ok
                else "no target (each needs more than all_reduce/broadcast)"
            )
        )
    lines.append("  gloo on CPU: every target, any world size")
    return "\n".join(lines)


def check_placement(target: Any, backend: str, device: str, world_size: int) -> None:
    """Raise a clear error when ``target`` cannot run ``world_size`` ranks on ``backend``/``device`` here."""
    if device == "cpu" and backend == "gloo":
        return
    n = cuda_device_count()
    if backend == "nccl" and n < world_size:
        raise InfrastructureError(
            f"backend='nccl' needs one CUDA device per rank: world_size={world_size} but {n} device(s) are "
            f"visible (NCCL refuses two ranks on one GPU).\n{placement_summary([target], n)}"
        )
    if backend == "gloo" and device == "cuda":
        if n == 0:
            raise InfrastructureError(
                f"device='cuda' but no CUDA device is visible.\n{placement_summary([target], n)}"
            )
        used = set(target.collectives) if target.collectives is not None else None
        if used is None or not used <= GLOO_CUDA_COLLECTIVES:
            what = (
                "does not declare its collectives"
                if used is None
                else f"uses {sorted(used - GLOO_CUDA_COLLECTIVES)}"
            )
            raise InvalidArgument(
                f"target {target.name!r} {what}; gloo on CUDA tensors supports only broadcast and all_reduce. "
                f"Use backend='nccl' (one GPU per rank) or device='cpu'.\n{placement_summary([target], n)}"
            )
