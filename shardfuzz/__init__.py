"""shardfuzz: property-based differential testing of sharded PyTorch code.

Importing this package does not import torch (the pytest plugin imports it at start-up); the
heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Case",
    "Finding",
    "IgnoredCollective",
    "InfrastructureError",
    "InvalidArgument",
    "LayoutMismatch",
    "Mismatch",
    "Owned",
    "PaddedFlat",
    "Partial",
    "RankContext",
    "RankError",
    "RankHang",
    "Replicate",
    "Result",
    "Runner",
    "Shard",
    "ShardfuzzError",
    "Target",
    "TargetError",
    "Tolerance",
    "Unsupported",
    "Zigzag",
    "__version__",
    "get_target",
    "regressions",
    "run",
    "test_for",
]

_LAZY = {
    "Case": "shardfuzz.case",
    "Finding": "shardfuzz.errors",
    "IgnoredCollective": "shardfuzz.errors",
    "InfrastructureError": "shardfuzz.errors",
    "InvalidArgument": "shardfuzz.errors",
    "LayoutMismatch": "shardfuzz.errors",
    "Mismatch": "shardfuzz.errors",
    "RankError": "shardfuzz.errors",
    "RankHang": "shardfuzz.errors",
    "ShardfuzzError": "shardfuzz.errors",
    "TargetError": "shardfuzz.errors",
    "Owned": "shardfuzz.layouts",
    "PaddedFlat": "shardfuzz.layouts",
    "Zigzag": "shardfuzz.layouts",
    "Unsupported": "shardfuzz.errors",
    "Partial": "shardfuzz.layouts",
    "Replicate": "shardfuzz.layouts",
    "Shard": "shardfuzz.layouts",
    "RankContext": "shardfuzz.worker",
    "Result": "shardfuzz.engine",
    "Runner": "shardfuzz.engine",
    "run": "shardfuzz.engine",
    "Target": "shardfuzz.target",
    "Tolerance": "shardfuzz.compare",
    "get_target": "shardfuzz.registry",
    "test_for": "shardfuzz.pytest_plugin",
    "regressions": "shardfuzz.pytest_plugin",
}

if TYPE_CHECKING:  # pragma: no cover
    from shardfuzz.case import Case
    from shardfuzz.compare import Tolerance
    from shardfuzz.engine import Result, Runner, run
    from shardfuzz.errors import (
        Finding,
        IgnoredCollective,
        InfrastructureError,
        InvalidArgument,
        LayoutMismatch,
        Mismatch,
        RankError,
        RankHang,
        ShardfuzzError,
        TargetError,
        Unsupported,
    )
    from shardfuzz.layouts import Owned, PaddedFlat, Partial, Replicate, Shard, Zigzag
    from shardfuzz.pytest_plugin import regressions, test_for
    from shardfuzz.registry import get_target
    from shardfuzz.target import Target
    from shardfuzz.worker import RankContext


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfuzz' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
