"""Packaging: the installed names, no torch at import, entry points."""

import importlib.metadata
import subprocess
import sys

import pytest


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
    assert "shardfuzz.frontends.cli:main" in {
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
