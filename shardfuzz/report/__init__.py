"""Stage ``report`` (layer 4 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

What a finding says: its text and one raise site per kind, the mismatch map, the plot and the
first divergent collective. Imports core, spec, ranks and verdict.

- ``closest_pass.py``: a clean run's closest pass in words (summary line, statistics, page), and measured with the noise term.
- ``divergence.py``: the first divergent collective of the ranks' traces (per group and per
  point-to-point pair), and the trace as text.
- ``findings.py``: the report text, and one raise site per finding kind.
- ``html_page.py``: a campaign's report as one self-contained HTML page (``fuzz --report DIR``).
- ``mismatch_map.py``: where a mismatch's wrong elements sit: runs per rank and dim, and a small
  grid with the shard boundaries (D39).
- ``plot.py``: `shardfuzz case --plot`: the oracle, the result, the error and the shard
  boundaries, drawn with matplotlib (an optional extra).
- ``tracebacks.py``: the `__tracebackhide__` predicate that hides the engine's frames from
  pytest when a finding propagates, and only then (D44).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    # 0.1's module ``shardfuzz.report`` is this package now: its names still resolve, with a warning,
    # until 0.3.0 (CHANGELOG, "Migration"). Lazy, so that importing a submodule stays light.

    findings = importlib.import_module("shardfuzz.report.findings")
    if name.startswith("__") or not hasattr(findings, name):
        raise AttributeError(f"module 'shardfuzz.report' has no attribute {name!r}")
    warnings.warn(
        f"shardfuzz.report.{name} moved to shardfuzz.report.findings.{name}; the old path goes in 0.3.0",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(findings, name)
