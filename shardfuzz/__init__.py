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
    "ShardfuzzWarning",
    "Target",
    "TargetError",
    "Tolerance",
    "Unsupported",
    "Verified",
    "Zigzag",
    "__version__",
    "bind",
    "decision",
    "get_target",
    "regressions",
    "run",
    "run_case",
    "test_for",
]

_LAZY = {
    "Case": "shardfuzz.case",
    "CommBudget": "shardfuzz.spec.budget",
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
    "ShardfuzzWarning": "shardfuzz.errors",
    "TargetError": "shardfuzz.errors",
    "FromDTensor": "shardfuzz.spec.placements",
    "AsDTensor": "shardfuzz.spec.placements",
    "Owned": "shardfuzz.spec.layouts",
    "PaddedFlat": "shardfuzz.spec.layouts",
    "Zigzag": "shardfuzz.spec.layouts",
    "Unsupported": "shardfuzz.errors",
    "Partial": "shardfuzz.spec.layouts",
    "Replicate": "shardfuzz.spec.layouts",
    "Shard": "shardfuzz.spec.layouts",
    "RankContext": "shardfuzz.ranks.task",
    "Result": "shardfuzz.engine.search",
    "Runner": "shardfuzz.engine.runner",
    "RunConfig": "shardfuzz.engine.config",
    "RunHooks": "shardfuzz.engine.hooks",
    "run": "shardfuzz.engine.search",
    "run_case": "shardfuzz.frontends.given",
    "Target": "shardfuzz.spec.target",
    "Bound": "shardfuzz.spec.records",
    "Expect": "shardfuzz.spec.records",
    "ExpectedFailure": "shardfuzz.spec.records",
    "PlantedBug": "shardfuzz.spec.records",
    "Verified": "shardfuzz.spec.records",
    "bind": "shardfuzz.spec.records",
    "decision": "shardfuzz.spec.decisions",
    "Tolerance": "shardfuzz.spec.tolerance",
    "OutputTolerance": "shardfuzz.spec.tolerance",
    "get_target": "shardfuzz.spec.registry",
    "test_for": "shardfuzz.frontends.pytest_plugin",
    "regressions": "shardfuzz.frontends.pytest_plugin",
}

if TYPE_CHECKING:  # pragma: no cover
    from shardfuzz.case import Case
    from shardfuzz.engine.config import RunConfig
    from shardfuzz.engine.hooks import RunHooks
    from shardfuzz.engine.runner import Runner
    from shardfuzz.engine.search import Result, run
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
    from shardfuzz.frontends.given import run_case
    from shardfuzz.frontends.pytest_plugin import regressions, test_for
    from shardfuzz.ranks.task import RankContext
    from shardfuzz.spec.budget import CommBudget
    from shardfuzz.spec.decisions import decision
    from shardfuzz.spec.layouts import Owned, PaddedFlat, Partial, Replicate, Shard, Zigzag
    from shardfuzz.spec.records import Bound, Expect, ExpectedFailure, PlantedBug, Verified, bind
    from shardfuzz.spec.registry import get_target
    from shardfuzz.spec.target import Target
    from shardfuzz.spec.tolerance import OutputTolerance, Tolerance


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
