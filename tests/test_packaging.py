"""Packaging: the installed names, no torch at import, entry points, package data."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = Path("shardfuzz", "repro", "templates", "standalone_harness.py")


@pytest.mark.parametrize("name", ["strategies", "targets"])
def test_no_bare_top_level_names(name, checkout_off_sys_path):
    # strategies/ and targets/ install only as shardfuzz.strategies / shardfuzz.targets
    with pytest.raises(ModuleNotFoundError):
        __import__(name)


def test_subpackages_install_under_shardfuzz():
    import shardfuzz.strategies
    import shardfuzz.targets.tp_mlp

    assert shardfuzz.strategies.__name__ == "shardfuzz.strategies"
    assert shardfuzz.targets.tp_mlp.TARGET.name == "tp_mlp"


@pytest.mark.parametrize("module", ["shardfuzz", "shardfuzz.frontends.pytest_plugin", "shardfuzz.strategies"])
def test_import_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_entry_points():
    eps = importlib.metadata.entry_points()
    assert "shardfuzz.frontends.pytest_plugin" in {ep.value for ep in eps.select(group="pytest11")}
    assert "shardfuzz.frontends.cli:entry" in {
        ep.value for ep in eps.select(group="console_scripts", name="shardfuzz")
    }


def test_public_api_is_complete():
    import importlib

    import shardfuzz

    lazy = shardfuzz._LAZY
    assert len(set(shardfuzz.__all__)) == len(shardfuzz.__all__), "a name listed twice in __all__"
    assert set(shardfuzz.__all__) == set(lazy) | {"__version__"}, "__all__ and the lazy table differ"
    assert set(shardfuzz.__all__) <= set(dir(shardfuzz))
    assert shardfuzz.__version__ == importlib.metadata.version("shardfuzz")
    for name, module in lazy.items():
        defined = getattr(importlib.import_module(module), name)
        assert getattr(shardfuzz, name) is defined, f"shardfuzz.{name} is not {module}.{name}"
        if hasattr(defined, "__module__"):  # defined there, not re-exported from elsewhere
            assert defined.__module__ == module, f"shardfuzz.{name} comes from {defined.__module__}"
    namespace: dict = {}
    exec("from shardfuzz import *", namespace)
    assert set(shardfuzz.__all__) - {"__version__"} <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        shardfuzz.nope  # noqa: B018


def test_the_standalone_harness_template_is_found_in_an_installed_package(tmp_path):
    # what a wheel holds is what setuptools' build_py puts in the build folder (the packages and the
    # package data pyproject.toml names): built from a copy of the sources, then read from there
    # alone (no site-packages, so not this editable checkout), as shardfuzz reads it
    pytest.importorskip("setuptools")
    src, lib = tmp_path / "src", tmp_path / "lib"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("shardfuzz", "strategies", "targets"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "-d", str(lib)]
    subprocess.run(build, cwd=src, check=True, capture_output=True)
    read = "import shardfuzz.repro.standalone_script as s; print(s.__file__); print(s.harness_template(), end='')"
    out = subprocess.run(
        [sys.executable, "-S", "-c", read],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(lib)},
        capture_output=True,
        text=True,
        check=True,
    )
    where, _, text = out.stdout.partition("\n")
    assert Path(where).is_relative_to(lib), where
    assert text == (ROOT / HARNESS).read_text()
