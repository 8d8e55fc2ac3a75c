"""shardfuzz: property-based differential testing of sharded PyTorch code.

Importing this package does not import torch (the pytest plugin imports it at start-up); the
heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AsDTensor",
    "Bound",
    "Case",
    "CommBudget",
    "CommunicationExceeded",
    "Expect",
    "ExpectedFailure",
    "ExternalFault",
    "Finding",
    "FromDTensor",
    "IgnoredCollective",
    "InfrastructureError",
    "InvalidArgument",
    "LayoutMismatch",
    "Mismatch",
    "OutputTolerance",
    "Owned",
    "PaddedFlat",
    "Partial",
    "PlantedBug",
    "RankContext",
    "RankError",
    "RankHang",
    "Replicate",
    "Result",
    "RunConfig",
    "RunHooks",
    "Runner",
    "Shard",
    "ShardfuzzError",
    "Target",
    "TargetError",
    "Tolerance",
    "Unsupported",
    "Zigzag",
    "__version__",
    "bind",
    "get_target",
    "regressions",
    "run",
    "run_case",
    "test_for",
]

_LAZY = {
    "Case": "shardfuzz.case",
    "CommBudget": "shardfuzz.comm",
    "CommunicationExceeded": "shardfuzz.errors",
    "Finding": "shardfuzz.errors",
    "ExternalFault": "shardfuzz.errors",
    "IgnoredCollective": "shardfuzz.errors",
    "InfrastructureError": "shardfuzz.errors",
    "InvalidArgument": "shardfuzz.errors",
    "LayoutMismatch": "shardfuzz.errors",
    "Mismatch": "shardfuzz.errors",
    "RankError": "shardfuzz.errors",
    "RankHang": "shardfuzz.errors",
    "ShardfuzzError": "shardfuzz.errors",
    "TargetError": "shardfuzz.errors",
    "FromDTensor": "shardfuzz.placements",
    "AsDTensor": "shardfuzz.placements",
    "Owned": "shardfuzz.layouts",
    "PaddedFlat": "shardfuzz.layouts",
    "Zigzag": "shardfuzz.layouts",
    "Unsupported": "shardfuzz.errors",
    "Partial": "shardfuzz.layouts",
    "Replicate": "shardfuzz.layouts",
    "Shard": "shardfuzz.layouts",
    "RankContext": "shardfuzz.rank",
    "Result": "shardfuzz.search",
    "Runner": "shardfuzz.runner",
    "RunConfig": "shardfuzz.config",
    "RunHooks": "shardfuzz.hooks",
    "run": "shardfuzz.search",
    "run_case": "shardfuzz.given",
    "Target": "shardfuzz.target",
    "Bound": "shardfuzz.records",
    "Expect": "shardfuzz.records",
    "ExpectedFailure": "shardfuzz.records",
    "PlantedBug": "shardfuzz.records",
    "bind": "shardfuzz.records",
    "Tolerance": "shardfuzz.tolerance",
    "OutputTolerance": "shardfuzz.tolerance",
    "get_target": "shardfuzz.registry",
    "test_for": "shardfuzz.pytest_plugin",
    "regressions": "shardfuzz.pytest_plugin",
}

if TYPE_CHECKING:  # pragma: no cover
    from shardfuzz.case import Case
    from shardfuzz.comm import CommBudget
    from shardfuzz.config import RunConfig
    from shardfuzz.errors import (
        CommunicationExceeded,
        ExternalFault,
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
    from shardfuzz.given import run_case
    from shardfuzz.hooks import RunHooks
    from shardfuzz.layouts import Owned, PaddedFlat, Partial, Replicate, Shard, Zigzag
    from shardfuzz.pytest_plugin import regressions, test_for
    from shardfuzz.rank import RankContext
    from shardfuzz.records import Bound, Expect, ExpectedFailure, PlantedBug, bind
    from shardfuzz.registry import get_target
    from shardfuzz.runner import Runner
    from shardfuzz.search import Result, run
    from shardfuzz.target import Target
    from shardfuzz.tolerance import OutputTolerance, Tolerance


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
