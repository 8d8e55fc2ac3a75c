"""Hypothesis settings profiles for shardfuzz.

Hypothesis ships its own ``ci`` profile (and loads it by itself when ``CI`` is set), so shardfuzz
never re-registers ``ci``, ``dev`` or ``fuzz``: that would change every Hypothesis test in a
user's project. It registers ``shardfuzz-ci``, ``shardfuzz-dev`` and ``shardfuzz-fuzz`` instead and,
when a test is *built* (at collection time, after ``--hypothesis-profile`` was loaded), picks
``shardfuzz-<current profile>``, falling back to ``shardfuzz-dev``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardfuzz.config import PROFILES as PROFILE_NAMES
from shardfuzz.errors import InvalidArgument

if TYPE_CHECKING:
    import hypothesis

DEFAULT_PROFILE = "shardfuzz-dev"


def _profiles() -> dict[str, dict[str, Any]]:
    from hypothesis import HealthCheck, Phase

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
    from hypothesis import settings

    for name, kw in _profiles().items():
        settings.register_profile(name, **kw)


def current_profile_name() -> str | None:
    from hypothesis import settings

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
    if current in PROFILE_NAMES:
        return current
    name = f"shardfuzz-{current}"
    return name if name in PROFILE_NAMES else DEFAULT_PROFILE


def build_settings(profile: str | None = None, **overrides: Any) -> hypothesis.settings:
    """Settings built *now* (not at import time) from a shardfuzz profile, with ``deadline=None``."""
    from hypothesis import settings

    register_profiles()
    name = profile or profile_for()
    if name not in PROFILE_NAMES:
        raise InvalidArgument(f"profile={name!r}; allowed: {', '.join(PROFILE_NAMES)}")
    base = settings.get_profile(name)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides["deadline"] = None
    return settings(base, **overrides)
