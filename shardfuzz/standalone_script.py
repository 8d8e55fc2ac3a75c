"""Moved to :mod:`shardfuzz.repro.standalone_script`. This alias goes in 0.3.0 (CHANGELOG, "Migration")."""

from shardfuzz._moved import alias

alias(__name__, "shardfuzz.repro.standalone_script", run_main=__name__ == "__main__")
