"""Hypothesis settings profiles for shardfuzz.

Hypothesis ships its own ``ci`` profile (and loads it by itself when ``CI`` is set), so shardfuzz
never re-registers ``ci``, ``dev`` or ``fuzz``: that would change every Hypothesis test in a
user's project. It registers ``shardfuzz-ci``, ``shardfuzz-dev`` and ``shardfuzz-fuzz`` instead and,
when a test is *built* (at collection time, after ``--hypothesis-profile`` was loaded), picks
``shardfuzz-<current profile>``, falling back to ``shardfuzz-dev``.
"""

from __future__ import annotations

import re
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, settings

from shardfuzz.engine.config import PROFILES as PROFILE_NAMES
from shardfuzz.errors import InvalidArgument

DEFAULT_PROFILE = "shardfuzz-dev"


def _profiles() -> dict[str, dict[str, Any]]:
    # the explain phase cost 269 executions against 17 in a measurement: never worth it here
    phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
    quiet_checks = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    common = dict(deadline=None, phases=phases, suppress_health_check=quiet_checks)
    return {
        # deterministic, no database: what CI runs
        "shardfuzz-ci": dict(common, max_examples=30, derandomize=True, database=None, print_blob=False),
        # day-to-day: the default database keeps and replays failures
        "shardfuzz-dev": dict(common, max_examples=100),
        # long campaigns
        "shardfuzz-fuzz": dict(common, max_examples=2000),
    }


def register_profiles() -> None:
    """Register the three shardfuzz profiles (idempotent)."""
    for name, kw in _profiles().items():
        settings.register_profile(name, **kw)


def current_profile_name() -> str | None:
    getter = getattr(settings, "get_current_profile_name", None)
    if getter is not None:
        try:
            return getter()
        except AssertionError:  # Hypothesis asserts a profile was loaded: none yet
            return None
    return getattr(settings, "_current_profile", None)


def profile_for(current: str | None = None) -> str:
    """``shardfuzz-<current>`` when such a profile exists, else :data:`DEFAULT_PROFILE`."""
    current = current_profile_name() if current is None else current
    # --hypothesis-verbosity / --hypothesis-explain load "ci-with-verbose-verbosity" and the like
    current = re.sub(r"(-with-\w+-verbosity|-with-explain-phase)+$", "", current or "")
    if current in PROFILE_NAMES:
        return current
    name = f"shardfuzz-{current}"
    return name if name in PROFILE_NAMES else DEFAULT_PROFILE


def build_settings(profile: str | None = None, **overrides: Any) -> hypothesis.settings:
    """Settings built *now* (not at import time) from a shardfuzz profile, with ``deadline=None``."""
    register_profiles()
    name = profile or profile_for()
    if name not in PROFILE_NAMES:
        raise InvalidArgument(f"profile={name!r}; allowed: {', '.join(PROFILE_NAMES)}")
    base = settings.get_profile(name)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides["deadline"] = None
    return settings(base, **overrides)


#: the Hypothesis settings a profile or ``@settings`` can change (``hypothesis.settings``' fields)
SETTING_NAMES = (
    "max_examples",
    "derandomize",
    "database",
    "verbosity",
    "phases",
    "stateful_step_count",
    "report_multiple_bugs",
    "suppress_health_check",
    "deadline",
    "print_blob",
    "backend",
)


def _changed(s: hypothesis.settings | None, against: hypothesis.settings) -> dict[str, Any]:
    """The settings of ``s`` whose values differ from ``against``'s."""
    if s is None:
        return {}
    return {n: getattr(s, n) for n in SETTING_NAMES if getattr(s, n) != getattr(against, n)}


def compose_settings(
    base: hypothesis.settings,
    profile: str,
    *,
    active: hypothesis.settings,
    applied: hypothesis.settings | None = None,
    **explicit: Any,
) -> hypothesis.settings:
    """The settings of a shardfuzz test that composes with the user's Hypothesis set-up, in layers
    (each wins over the ones before it):

    1. ``profile``, the shardfuzz profile (``shardfuzz-ci``, ``-dev``, ``-fuzz``);
    2. what the ``active`` profile sets away from Hypothesis' ``default`` profile (a user's
       ``nightly`` with ``max_examples=300``; Hypothesis' ``ci`` with ``print_blob=True``);
    3. what ``base`` (the shardfuzz profile built with the run's options, e.g.
       ``--shardfuzz-max-examples``) sets away from ``profile``;
    4. what the user's ``@settings`` on the test (``applied``) sets away from the active profile;
    5. ``explicit`` arguments that are not None (``test_for(max_examples=...)``).

    Health checks that any layer suppresses stay suppressed (shardfuzz's examples are slow by
    nature). The deadline stays None: shardfuzz times each example itself (``--shardfuzz-timeout``),
    and a deadline written for unit tests would fail every slow first example; an ``@settings``
    deadline on a shardfuzz test is refused rather than ignored.
    """
    shardfuzz = settings.get_profile(profile)
    user = _changed(applied, active)
    if user.get("deadline") is not None:
        raise InvalidArgument(
            f"@settings(deadline={user['deadline']!r}) on a shardfuzz test: shardfuzz times each example "
            "itself; give test_for(timeout=SECONDS) or --shardfuzz-timeout instead"
        )
    layers = [_changed(active, settings.get_profile("default")), _changed(base, shardfuzz), user, explicit]
    kw: dict[str, Any] = {}
    suppressed = list(shardfuzz.suppress_health_check)
    for layer in layers:
        kw.update({k: v for k, v in layer.items() if v is not None or k == "database"})
        suppressed += layer.get("suppress_health_check") or ()
    kw["suppress_health_check"] = list(dict.fromkeys(suppressed))
    kw["deadline"] = None
    database = kw.pop("database", "unchanged")
    composed = settings(shardfuzz, **kw)
    # set apart: derandomize=True and a database in one call is refused, even when they come
    # from different layers (a derandomized run then simply does not use the database)
    return composed if database == "unchanged" else settings(composed, database=database)


def profile_changes(profile: str) -> str:
    """What the active Hypothesis profile changes in a shardfuzz test's settings (the pytest
    plugin's header)."""
    composed = compose_settings(build_settings(profile), profile, active=settings())
    shardfuzz = settings.get_profile(profile)
    same = lambda n: _comparable(getattr(composed, n)) == _comparable(getattr(shardfuzz, n))
    return ", ".join(f"{n}={getattr(composed, n)!r}" for n in SETTING_NAMES if not same(n))


def _comparable(value: Any) -> Any:
    return frozenset(value) if isinstance(value, (list, tuple)) else value
