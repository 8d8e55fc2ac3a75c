"""Moved to :mod:`shardfuzz.report.mismatch_map`. This alias goes in 0.3.0 (CHANGELOG, "Migration")."""

from shardfuzz._moved import alias

alias(__name__, "shardfuzz.report.mismatch_map")
