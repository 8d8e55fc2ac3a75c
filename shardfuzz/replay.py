"""Moved to :mod:`shardfuzz.repro.replay`. This alias goes in 0.3.0 (CHANGELOG, "Migration")."""

from shardfuzz._moved import alias

alias(__name__, "shardfuzz.repro.replay")
