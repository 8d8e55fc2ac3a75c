"""Moved to :mod:`shardfuzz.ranks.spawn`. This alias goes in 0.3.0 (CHANGELOG, "Migration")."""

from shardfuzz._moved import alias

alias(__name__, "shardfuzz.ranks.spawn", run_main=__name__ == "__main__")
