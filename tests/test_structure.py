"""The engine's structure stays as docs/design.md describes it: no import cycle between shardfuzz
modules, imports between them in module headers, no module over 350 lines, every module listed
in the README, and ``import shardfuzz`` imports neither torch nor Hypothesis."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENGINE = ROOT / "shardfuzz"
MODULES = sorted(p.stem for p in ENGINE.glob("*.py"))
MAX_LINES = 350


def _shardfuzz_imports(tree: ast.AST) -> list[tuple[str, ast.stmt]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "shardfuzz":
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            out += [(n, node) for n in names]
        elif isinstance(node, ast.Import):
            out += [(a.name, node) for a in node.names if a.name.split(".")[0] == "shardfuzz"]
    return out


def _engine_module(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in MODULES else None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod in MODULES:
        tree = ast.parse((ENGINE / f"{mod}.py").read_text())
        type_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        graph[mod] = {
            dep
            for name, node in _shardfuzz_imports(tree)
            if id(node) not in type_only and (dep := _engine_module(name)) and dep != mod
        }
    return graph


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


def test_no_import_cycle_between_shardfuzz_modules():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()) or [])


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", MODULES)
def test_imports_between_shardfuzz_modules_sit_in_the_module_header(module):
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    header = {
        id(n)
        for stmt in tree.body
        for n in ast.walk(stmt)
        if not isinstance(stmt, ast.FunctionDef | ast.ClassDef)
    }
    lazy = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for _, node in _shardfuzz_imports(tree)
        if id(node) not in header
    ]
    assert not lazy, f"shardfuzz/{module}.py imports shardfuzz modules inside functions: {sorted(set(lazy))}"


@pytest.mark.parametrize("module", MODULES)
def test_no_engine_module_is_over_the_line_limit(module):
    lines = len((ENGINE / f"{module}.py").read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"shardfuzz/{module}.py has {lines} lines (limit {MAX_LINES}): split it by stage"
    )


def test_readme_layout_lists_every_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout of the repository", 1)[1].split("\n## ", 1)[0]
    missing = [m for m in MODULES if f"`{m}.py`" not in layout]
    assert not missing, f"the README's layout section does not list {missing}"
    design = (ROOT / "docs" / "design.md").read_text()
    assert not [m for m in MODULES if f"{m}.py" not in design], "docs/design.md's module map is incomplete"


@pytest.mark.parametrize("module", ["shardfuzz", "shardfuzz.cli"])
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
