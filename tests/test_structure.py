"""The engine's house, as docs/design.md describes it: one package per stage of the data flow,
layers that only import downward, no import cycle, no private name borrowed from another module,
each package's docstring its map, and ``import shardfuzz`` free of torch and Hypothesis.

The checks read the source (``ast``), never import it, so a violation is named by file and line."""

from __future__ import annotations

import ast
import functools
import json
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENGINE = ROOT / "shardfuzz"
# The stages, lowest first: a module may import its own package and any package listed before it.
# core: shardfuzz/*.py (errors, case, limits, protocol); the package __init__ and the 0.1 aliases
# are not in the graph (the one loads the public API lazily, the others only redirect).
LAYERS = ("core", "spec", "ranks", "verdict", "report", "engine", "repro", "frontends")
NOTICE_LINES = 500


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the shardfuzz module imported, dotted
    names: tuple[str, ...]  # the names taken from it (``from m import a, b``), else ()
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``
    in_header: bool  # at module level, not inside a function or class


def _dotted(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_alias(path: pathlib.Path) -> bool:
    """A 0.1 module path kept as an alias of its new home (``shardfuzz/_moved.py``)."""
    return path.parent == ENGINE and "from shardfuzz._moved import alias" in path.read_text()


def engine_files() -> dict[str, pathlib.Path]:
    """Every module of the engine (not the aliases, not the top-level lazy ``__init__``, not the
    templates: ``repro/templates/`` holds the text of generated scripts, never imported)."""
    return {
        _dotted(p): p
        for p in sorted(ENGINE.rglob("*.py"))
        if not is_alias(p)
        and p != ENGINE / "__init__.py"
        and p != ENGINE / "_moved.py"
        and "templates" not in p.relative_to(ENGINE).parts
    }


MODULES = engine_files()


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "core"


def _resolve(name: str, known: set[str]) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


def node_places(tree: ast.Module) -> tuple[set[int], set[int]]:
    """The ids of the nodes under ``if TYPE_CHECKING:``, and of those in the module header (not
    inside a function or class)."""
    type_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    header = {
        id(n)
        for stmt in tree.body
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for n in ast.walk(stmt)
    }
    return type_only, header


def imports_of(module: str, path: pathlib.Path, known: set[str] | None = None) -> list[Import]:
    known = known if known is not None else set(MODULES) | {_dotted(p) for p in ENGINE.glob("*.py")}
    tree = ast.parse(path.read_text())
    type_only, header = node_places(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        found: list[tuple[str, tuple[str, ...]]] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            if base.split(".")[0] != "shardfuzz":
                continue
            for a in node.names:  # ``from shardfuzz.pkg import module`` imports the module
                if f"{base}.{a.name}" in known:
                    found.append((f"{base}.{a.name}", ()))
                elif (target := _resolve(base, known)) is not None:
                    found.append((target, (a.name,)))
        elif isinstance(node, ast.Import):
            found = [(t, ()) for a in node.names if (t := _resolve(a.name, known))]
        for target, names in found:
            if target != module:
                out.append(
                    Import(module, target, names, node.lineno, id(node) in type_only, id(node) in header)
                )
    return out


@functools.cache  # four tests read the whole graph: the sources are parsed once per process
def all_imports() -> tuple[Import, ...]:
    return tuple(imp for module, path in MODULES.items() for imp in imports_of(module, path))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def layer_violations(imports: Sequence[Import]) -> list[str]:
    """Imports that reach a package above the importer's layer (type-only imports included: a
    type from above is a dependency on above)."""
    return [
        f"{i.module} ({layer_of(i.module)}) imports {i.target} ({layer_of(i.target)}), line {i.line}"
        for i in imports
        if LAYERS.index(layer_of(i.target)) > LAYERS.index(layer_of(i.module))
    ]


def private_imports(imports: Sequence[Import]) -> list[str]:
    return [
        f"{i.module} imports {n} from {i.target}, line {i.line}"
        for i in imports
        for n in i.names
        if n.startswith("_") and not n.startswith("__")
    ]


def test_no_import_cycle_between_shardfuzz_modules():
    graph: dict[str, set[str]] = {}
    for i in all_imports():
        if i.in_header and not i.type_only:
            graph.setdefault(i.module, set()).add(i.target)
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_sits_in_a_known_layer():
    strays = [m for m in MODULES if layer_of(m) not in LAYERS]
    assert not strays, f"modules outside the layers {LAYERS}: {strays}"
    packages = sorted(p.name for p in ENGINE.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(LAYERS[1:]), f"packages {packages}, layers {LAYERS[1:]}: write the new one down"


def test_no_package_imports_a_package_above_its_layer():
    bad = layer_violations(all_imports())
    assert not bad, "imports that run up the layers " + " > ".join(LAYERS) + ":\n" + "\n".join(bad)


def test_layer_rule_sees_an_upward_import():
    up = Import("shardfuzz.spec.target", "shardfuzz.engine.runner", ("Runner",), 1, True, True)
    down = Import("shardfuzz.engine.runner", "shardfuzz.spec.target", ("Target",), 1, False, True)
    assert layer_violations([up, down]) == [
        "shardfuzz.spec.target (spec) imports shardfuzz.engine.runner (engine), line 1"
    ]


def test_no_module_imports_a_private_name_from_another_module():
    bad = private_imports(all_imports())
    assert not bad, "make these public or move them where they are used:\n" + "\n".join(bad)


def test_private_name_rule_sees_a_private_import():
    assert private_imports([Import("a", "b", ("_x", "y", "__all__"), 3, False, True)]) == [
        "a imports _x from b, line 3"
    ]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_between_shardfuzz_modules_sit_in_the_module_header(module):
    # lazy imports only at the seams that must start fast: the CLI and the pytest plugin
    if module in {"shardfuzz.frontends.cli", "shardfuzz.frontends.pytest_plugin"}:
        return
    lazy = sorted(
        {f"line {i.line}: {i.target}" for i in imports_of(module, MODULES[module]) if not i.in_header}
    )
    assert not lazy, f"{module} imports shardfuzz modules inside functions: {lazy}"


#: where the engine's own modules may be imported inside functions (the test above)
SEAMS = ("shardfuzz.frontends.cli", "shardfuzz.frontends.pytest_plugin")

#: modules that any engine module may import inside a function, and why; every other import sits
#: in the module header (a submodule is covered by its package's entry)
LAZY_IMPORTS = {
    "matplotlib": "optional extra [plot]: `shardfuzz case --plot` only (report/plot.py)",
    "redis": "optional extra [redis]: a fleet's redis:// database only (engine/shared_db.py)",
    "hypothesis.extra.redis": "imports redis, the optional extra [redis] (engine/shared_db.py)",
    "torch.distributed.tensor": "DTensor costs 0.7-1.2 s on top of torch: only a driver whose "
    "target hands out or returns DTensors pays it; the ranks' forkserver preloads it (spec/placements.py)",
    "importlib.metadata": "about 20 ms of `shardfuzz --help`: read only when targets are looked up "
    "by entry point (spec/registry.py)",
}

#: modules that `shardfuzz --help` or a pytest session with the plugin loads before any work, and
#: that therefore import torch and Hypothesis (STARTUP_HEAVY) inside their functions, not in their
#: header (checked against what the seams really load: test_start_up_modules_are_what_the_seams_load)
START_UP = {
    "shardfuzz.protocol": "the CLI's parser loads it (cli_args > engine.trust > spec.registry > spec.target)",
    "shardfuzz.spec.target": "the CLI's parser loads it (cli_args > engine.trust > spec.registry)",
    "shardfuzz.spec.layouts": "the CLI's parser loads it (> spec.target)",
    "shardfuzz.spec.tolerance": "the plugin's options and the CLI's parser (> engine.config, cli_args)",
    "shardfuzz.engine.shared_db": "the plugin's --shardfuzz-database and the CLI's parser (> engine.config)",
    "shardfuzz.engine.hooks": "the CLI's interrupts and grace period (cli, jobs)",
    "shardfuzz.ranks.trace": "the CLI's --trace/--comm (> report.divergence, verdict.comm)",
}
#: modules a seam imports before torch to start the ranks' forkserver first (its preload of torch
#: then overlaps with the driver's own import of it: about 1 s of every campaign's start), which
#: therefore import torch inside their functions too (test_the_forkserver_starts_before_torch_loads)
BEFORE_TORCH = {
    "shardfuzz.ranks.spawn": "the CLI's commands and the plugin's tests call start_forkserver "
    "before they import the engine",
}
STARTUP_HEAVY = ("torch", "hypothesis")


def lazy_import_violations(module: str, source: str) -> list[str]:
    """The imports of modules outside shardfuzz that ``source`` (module ``module``) makes inside a
    function or class, neither under ``if TYPE_CHECKING:`` nor allowed by LAZY_IMPORTS or
    START_UP."""
    tree = ast.parse(source)
    type_only, header = node_places(tree)
    bad = []
    for node in ast.walk(tree):
        if id(node) in header or id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            allowed = any(name == m or name.startswith(m + ".") for m in LAZY_IMPORTS) or (
                (module in START_UP or module in BEFORE_TORCH) and top in STARTUP_HEAVY
            )
            if top != "shardfuzz" and not allowed:
                bad.append(f"{module} line {node.lineno}: {name}")
    return bad


def test_function_level_imports_are_of_the_allowed_modules_only():
    bad = [
        v
        for module, path in MODULES.items()
        if module not in SEAMS
        for v in lazy_import_violations(module, path.read_text())
    ]
    assert not bad, (
        "import these in the module header, or add the module to LAZY_IMPORTS with the reason it "
        "must stay lazy:\n" + "\n".join(bad)
    )


def test_lazy_import_rule_sees_a_function_level_import():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import numpy\n"
        "def f():\n    import torch\n    import json\n    from torch.distributed.tensor import DTensor\n"
        "    import matplotlib.pyplot\n    from shardfuzz.case import Case\n"
        "class C:\n    def g(self):\n        from hypothesis import given\n"
    )
    assert lazy_import_violations("shardfuzz.planted", source) == [
        "shardfuzz.planted line 5: torch",
        "shardfuzz.planted line 6: json",
        "shardfuzz.planted line 12: hypothesis",
    ]
    start_up = next(iter(START_UP))  # may defer torch and Hypothesis, and nothing else
    assert lazy_import_violations(start_up, source) == [f"{start_up} line 6: json"]


def seam_start_modules(tmp_path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(shardfuzz modules, heavy modules) loaded by ``shardfuzz --help`` and by a pytest session
    that runs one plain test with the plugin (configure, header, a test, session finish)."""
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    report = (
        "import json, sys; print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith('shardfuzz') or m.split('.')[0] in ('torch', 'hypothesis'))))"
    )
    cli = (
        "import contextlib, io\nfrom shardfuzz.frontends import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    cli.main(['--help'])\n" + report
    )
    session = (
        "import contextlib, io, pytest\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:shardfuzz', '-p',"
        " 'shardfuzz.frontends.pytest_plugin', 'test_plain.py'])\n"
        "assert code == 0, code\n" + report
    )
    loaded: set[str] = set()
    for code in (cli, session):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
        )
        assert out.returncode == 0, out.stderr
        loaded |= set(json.loads(out.stdout.strip().splitlines()[-1]))
    ours = {m for m in loaded if m.startswith("shardfuzz")}
    return ours, loaded - ours


def test_start_up_modules_are_what_the_seams_load(tmp_path):
    ours, heavy = seam_start_modules(tmp_path)
    assert "shardfuzz.frontends.pytest_plugin" in ours and "shardfuzz.frontends.cli_args" in ours
    assert "torch" not in heavy, f"a seam's start imports torch; it loads {sorted(ours)}"
    stale = sorted(set(START_UP) - ours)
    assert not stale, f"the seams no longer load {stale} at start: drop them from START_UP"


def test_the_forkserver_starts_before_torch_loads(tmp_path):
    """The CLI's commands that run ranks, and the plugin's tests, start the forkserver before they
    import the engine (torch): a start that comes after torch costs about 1 s of every run."""
    stop = (
        "import sys\n"
        "class Started(Exception):\n    pass\n"
        "def start():\n"
        "    with open('started.txt', 'a') as f:\n"
        "        f.write(str('torch' in sys.modules) + '\\n')\n"
        "    raise Started\n"
    )
    cli = (
        stop + "from shardfuzz.ranks import spawn\nspawn.start_forkserver = start\n"
        "from shardfuzz.frontends import cli\n"
        "for argv in (['fuzz', 'tp_mlp'], ['case', 'tp_mlp', 'x'], ['replay', 'x.json']):\n"
        "    try:\n        cli.main(argv)\n    except Started:\n        pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", cli], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "started.txt").read_text().split() == ["False"] * 3
    (tmp_path / "started.txt").unlink()
    (tmp_path / "conftest.py").write_text(
        stop + "import shardfuzz.frontends.pytest_plugin as plugin\nplugin.start_forkserver = start\n"
    )
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "f.json").write_text("{}")
    (tmp_path / "test_for.py").write_text("import shardfuzz\ntest_tp = shardfuzz.test_for('tp_mlp')\n")
    (tmp_path / "test_regressions.py").write_text(
        "import shardfuzz\ntest_files = shardfuzz.regressions('failures')\n"
    )
    flags = ["-p", "no:cacheprovider", "-p", "no:shardfuzz", "-p", "shardfuzz.frontends.pytest_plugin"]
    session = [sys.executable, "-m", "pytest", *flags, "--continue-on-collection-errors", "-q"]
    out = subprocess.run(session, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "Started" in out.stdout, out.stdout + out.stderr
    # regressions() at collection (a file to replay), then test_for's test when it runs
    assert (tmp_path / "started.txt").read_text().split() == ["False"] * 2, out.stdout


def test_nothing_in_the_engine_imports_a_0_1_alias():
    aliases = {_dotted(p) for p in ENGINE.glob("*.py") if is_alias(p)}
    assert aliases, "the 0.1 aliases are gone: drop this test with them"
    bad = [f"{i.module} line {i.line}: {i.target}" for i in all_imports() if i.target in aliases]
    assert not bad, bad


def test_each_package_docstring_is_its_map():
    for package in LAYERS[1:]:
        init = ENGINE / package / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        missing = [
            p.name for p in sorted(init.parent.glob("*.py")) if p.name != "__init__.py" and p.name not in doc
        ]
        assert not missing, f"shardfuzz/{package}/__init__.py's docstring does not name {missing}"


def test_long_modules_are_noticed_not_failed(capsys):
    # No line cap: a cap trims explanations. A module past NOTICE_LINES is printed for a look.
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > NOTICE_LINES}
    with capsys.disabled():
        for m, n in sorted(long.items()):
            print(f"\nnotice: {m} has {n} lines (over {NOTICE_LINES}): does it still do one thing?")


def test_readme_and_design_list_every_module():
    design = (ROOT / "docs" / "design.md").read_text()
    rel = [str(p.relative_to(ENGINE)) for p in MODULES.values() if p.name != "__init__.py"]
    missing = [r for r in rel if f"`{r}`" not in design]
    assert not missing, f"docs/design.md's module map does not list {missing}"


@pytest.mark.parametrize("module", ["shardfuzz", "shardfuzz.frontends.cli"])
def test_import_does_not_import_torch_or_hypothesis(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'hypothesis') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_file_refers_to_documents_outside_the_repository():
    offenders = []
    for path in [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("*/*.py"), *ROOT.glob("*/*/*.py")]:
        if ".venv" in path.parts or path.name == "test_structure.py":
            continue
        text = path.read_text(errors="replace")
        if "BUG-PATTERNS.md" in text or "DESIGN.md" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


def test_every_0_1_module_path_is_the_new_module_itself():
    import importlib
    import re
    import warnings

    for path in sorted(ENGINE.glob("*.py")):
        if not is_alias(path):
            continue
        new = re.search(r'alias\(__name__, "([\w.]+)"', path.read_text())
        assert new, f"{path.name}: an alias names its new module"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            old = importlib.import_module(f"shardfuzz.{path.stem}")
        assert old is importlib.import_module(new.group(1)), path.name
        assert (
            any(issubclass(w.category, DeprecationWarning) for w in seen)
            or f"shardfuzz.{path.stem}" in sys.modules
        )
