"""Packaging: the installed names, no torch at import, entry points."""

import importlib.metadata
import subprocess
import sys

import pytest


@pytest.mark.parametrize("name", ["strategies", "targets"])
def test_no_bare_top_level_names(name):
    # strategies/ and targets/ install only as shardfuzz.strategies / shardfuzz.targets
    with pytest.raises(ModuleNotFoundError):
        __import__(name)


def test_subpackages_install_under_shardfuzz():
    import shardfuzz.strategies
    import shardfuzz.targets.tp_mlp

    assert shardfuzz.strategies.__name__ == "shardfuzz.strategies"
    assert shardfuzz.targets.tp_mlp.TARGET.name == "tp_mlp"


@pytest.mark.parametrize("module", ["shardfuzz", "shardfuzz.pytest_plugin", "shardfuzz.strategies"])
def test_import_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_entry_points():
    eps = importlib.metadata.entry_points()
    assert "shardfuzz.pytest_plugin" in {ep.value for ep in eps.select(group="pytest11")}
    assert "shardfuzz.cli:main" in {ep.value for ep in eps.select(group="console_scripts", name="shardfuzz")}


def test_public_api_is_complete():
    import shardfuzz

    for name in shardfuzz.__all__:
        assert getattr(shardfuzz, name) is not None
