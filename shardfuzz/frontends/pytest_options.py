"""The values of the pytest plugin's ``--shardfuzz-*`` options, parsed and checked: a bad one is a
pytest usage error (exit 4) that names the option, the value and what is allowed."""

from __future__ import annotations

import pytest

from shardfuzz.engine import config
from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.exclude import CaseExpression
from shardfuzz.spec.tolerance import OutputTolerance

HELP_MAX_EXAMPLES = (
    "examples per shardfuzz test (default: the profile's; @settings or test_for's argument wins)."
)
HELP_PROFILE = "the shardfuzz profile (default: shardfuzz-<--hypothesis-profile>, else shardfuzz-dev)."
HELP_DEVICE = "where the ranks compute: cpu or cuda (default: cuda for nccl, cpu for gloo)."


def parse_max_examples(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise pytest.UsageError(f"--shardfuzz-max-examples={value!r}; must be an integer >= 1")
    return value


def parse_world_sizes(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        sizes = config.parse_world_sizes(text)
    except ValueError as e:
        raise pytest.UsageError(f"--shardfuzz-world-sizes={e}") from None
    try:
        for w in sizes:
            config.check_world_size(w, "--shardfuzz-world-sizes")
    except InvalidArgument as e:
        raise pytest.UsageError(str(e)) from None
    return sizes


def parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    try:
        return config.parse_dtypes(text) if text else None
    except ValueError as e:
        raise pytest.UsageError(f"--shardfuzz-dtypes {e}") from None


def parse_tolerances(texts: list[str] | None) -> tuple[tuple[str, OutputTolerance], ...]:
    out: dict[str, OutputTolerance] = {}
    for text in texts or []:
        try:
            name, tol = config.parse_tolerance(text)
        except ValueError as e:
            raise pytest.UsageError(f"--shardfuzz-tolerance {e}") from None
        out[name] = tol
    return tuple(sorted(out.items()))


def parse_excludes(texts: list[str] | None) -> tuple[str, ...]:
    try:
        return tuple(CaseExpression(t, "--shardfuzz-exclude").text for t in texts or [])
    except InvalidArgument as e:
        raise pytest.UsageError(str(e)) from None
