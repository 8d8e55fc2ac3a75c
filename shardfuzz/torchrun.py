"""Moved to :mod:`shardfuzz.repro.torchrun`. This alias goes in 0.3.0 (CHANGELOG, "Migration")."""

from shardfuzz._moved import alias

alias(__name__, "shardfuzz.repro.torchrun", run_main=__name__ == "__main__")
