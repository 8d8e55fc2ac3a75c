"""Moved to :mod:`shardfuzz.frontends.doc_tables`. This alias goes in 0.3.0 (CHANGELOG, "Migration")."""

from shardfuzz._moved import alias

alias(__name__, "shardfuzz.frontends.doc_tables", run_main=__name__ == "__main__")
