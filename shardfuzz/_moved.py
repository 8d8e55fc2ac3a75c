"""The module paths of shardfuzz 0.1, kept for one release as aliases of their homes by stage.

Each old ``shardfuzz/<name>.py`` is one call to :func:`alias`: importing it warns once and hands
back the new module itself (not a copy), so ``monkeypatch.setattr`` on either path patches the
same object. The aliases go in 0.3.0 (CHANGELOG, "Migration")."""

from __future__ import annotations

import importlib
import runpy
import sys
import warnings


def alias(old: str, new: str, *, run_main: bool = False) -> None:
    """Make the module named ``old`` the module ``new``; under ``python -m old``, run ``new``."""
    if run_main:  # `python -m shardfuzz.repro.torchrun FILE` (documented in 0.1) keeps working
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    warnings.warn(f"{old} moved to {new}; the old path goes in 0.3.0", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
