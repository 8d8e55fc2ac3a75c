"""Every list and table of the docs that the code knows, generated from the code.

    python -m shardfuzz.frontends.doc_tables --write    # regenerate every generated section of every doc
    python -m shardfuzz.frontends.doc_tables --check    # exit 1 naming the files whose sections drifted
    python -m shardfuzz.frontends.doc_tables            # print every built-in target's table

The docs are ``README.md``, ``CONTRIBUTING.md`` and ``docs/**/*.md``. A generated section sits
between markers, and only its body is rewritten:

* ``<!-- shardfuzz:table NAME -->`` ... ``<!-- /shardfuzz:table -->``: target NAME's planted bugs and
  expected failures, from its records (``docs/targets/NAME.md``);
* ``<!-- shardfuzz:gen KEY -->`` ... ``<!-- /shardfuzz:gen -->``: one of :data:`GENERATORS` (the CLI's
  options from its argparse parser, the pytest options from ``pytest_addoption``, the environment
  variables from :data:`shardfuzz.limits.ENVIRONMENT`, the finding kinds, the failure file's fields,
  the built-in targets, the Hypothesis profiles, the figures of CONTRIBUTING.md's proofs);
* ``<!-- shardfuzz:verified NAME -->`` ... ``<!-- /shardfuzz:verified -->``: target NAME's
  implementations verified to pass, from its ``Verified`` records.

``tests/test_readme.py`` checks that every generated section matches the code, so a doc fails the suite when it drifts.
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hypothesis import settings

from shardfuzz.engine.config import PROFILES
from shardfuzz.engine.failure_schema import SCHEMA
from shardfuzz.engine.settings import register_profiles
from shardfuzz.errors import Finding
from shardfuzz.frontends.cli_args import build_parser
from shardfuzz.frontends.pytest_plugin import pytest_addoption
from shardfuzz.frontends.testing import budget
from shardfuzz.limits import ENVIRONMENT, OTHER_ENVIRONMENT
from shardfuzz.spec.records import KINDS, Expect
from shardfuzz.spec.registry import builtin_targets, get_target

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: the command that regenerates every generated section (failing tests name it)
REGENERATE = "python -m shardfuzz.frontends.doc_tables --write"

MARKER = re.compile(r"(<!-- shardfuzz:table (\w+) -->\n)(.*?)(<!-- /shardfuzz:table -->)", re.S)
VERIFIED = re.compile(r"(<!-- shardfuzz:verified (\w+) -->\n)(.*?)(<!-- /shardfuzz:verified -->)", re.S)
GENERATED = re.compile(r"(<!-- shardfuzz:gen ([\w-]+) -->\n)(.*?)(<!-- /shardfuzz:gen -->)", re.S)


def doc_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every markdown file of the docs: the README, CONTRIBUTING.md and ``docs/**/*.md``."""
    top = [root / n for n in ("README.md", "CONTRIBUTING.md") if (root / n).exists()]
    return top + sorted((root / "docs").rglob("*.md"))


def _cell(text: Any) -> str:
    """Text for a markdown table cell: one line, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _rel(base: pathlib.Path, path: pathlib.Path) -> str:
    """``path`` relative to the folder ``base``, with ``/`` (for a markdown link)."""

    return pathlib.PurePath(os.path.relpath(path, base)).as_posix()


# -- target tables ------------------------------------------------------------------------------


def _link(link: str) -> str:
    return f" ({link})" if link else ""


def minimal_case(expect: Expect) -> str:
    """The declared shape of the minimal case: world size, mesh, uneven sizes."""
    worlds = expect.world_size if isinstance(expect.world_size, tuple) else (expect.world_size,)
    ranks = " or ".join(str(w) for w in worlds)
    parts = [f"{ranks} rank{'s' if worlds != (1,) else ''}"]
    if expect.mesh is not None and len(expect.mesh) > 1:
        parts.append(f"mesh {expect.mesh}")
    if expect.uneven:
        parts.append(f"uneven {', '.join(expect.uneven)}")
    if expect.options:
        parts.append("searched with " + ", ".join(f"`{k}={v}`" for k, v in expect.options))
    if expect.note:
        parts.append(expect.note)
    if len(expect.needs) >= 2:
        parts.append("needs " + " and ".join(f"`{n}`" for n in expect.needs))
    return ", ".join(parts)


def finding(expect: Expect) -> str:
    wrong = expect.outputs if isinstance(expect.outputs, tuple) else ()
    return " or ".join(expect.kinds) + (f" ({', '.join(f'`{o}`' for o in wrong)})" if wrong else "")


def table(target: Any) -> str:
    """The markdown table of one target's planted bugs and expected failures."""
    rows = ["| implementation | models | minimal case | finding | p95 |", "|---|---|---|---|---|"]
    for rec in target.planted.values():
        rows.append(
            f"| `{rec.name}` | {rec.models}{_link(rec.link)} | {minimal_case(rec.expect)} "
            f"| {finding(rec.expect)} | {rec.p95} |"
        )
    for rec in target.expected_failures.values():
        rows.append(
            f"| `{rec.name}` | expected failure: {rec.reason}{_link(rec.link)} | {minimal_case(rec.expect)} "
            f"| {finding(rec.expect)} | {rec.p95} |"
        )
    return "\n".join(rows) + "\n"


def _codes(items: Any) -> str:
    return ", ".join(f"`{i}`" for i in items) or "-"


def verified_table(target: Any) -> str:
    """The markdown table of one target's implementations verified to pass (its ``Verified``
    records, each run by ``tests/test_verified.py``)."""
    if not target.verified:
        return (
            f"None recorded: `{target.name}`'s reference (`{target.reference}`) is proved by the reference "
            "tests; its other implementations are its planted bugs and expected failures.\n"
        )
    rows = [
        "| implementation | what | ci run | pinned, set aside | must reach | must refuse |",
        "|---|---|---|---|---|---|",
    ]
    for rec in target.verified.values():
        run = f"{rec.examples} examples in each of {', '.join(rec.dtypes)}"
        if rec.world_sizes is not None:
            run += f", world sizes {', '.join(map(str, rec.world_sizes))}"
        pinned = [f"`{k}={v!r}`" for k, v in rec.options.items()] + [f"excluded `{e}`" for e in rec.exclude]
        reach = [*rec.reaches, *rec.also_reaches]
        rows.append(
            f"| `{rec.name}` | {_cell(rec.what)} | {run} | {'; '.join(pinned) or '-'} "
            f"| {_cell(_codes(reach))} | {_cell(_codes(rec.refuses))} |"
        )
    return "\n".join(rows) + "\n"


# -- the command line and the pytest options --------------------------------------------------


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    return f"`{_cell(metavar)}`"


def _default(action: argparse.Action) -> str:
    d = action.default
    if d is None or d is False or d == [] or d == argparse.SUPPRESS or action.nargs == 0:
        return ""
    return f"`{d}`"


def _what(action: argparse.Action, exclusive: set[str]) -> str:
    what = _cell(action.help or "")
    if isinstance(action, argparse._AppendAction):
        what += " (repeatable)" if "repeatable" not in what else ""
    if action.dest in exclusive:
        others = sorted(exclusive - {action.dest})
        what += " (not with " + ", ".join(f"`--{o.replace('_', '-')}`" for o in others) + ")"
    return what


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def cli_options() -> str:
    """Every subcommand of ``shardfuzz`` and its arguments, from the argparse parser itself."""

    parser = build_parser()
    out = ["| command | what |", "|---|---|"]
    subs = list(_subcommands(parser))
    out += [f"| [`shardfuzz {name}`](#shardfuzz-{name}) | {_cell(what)} |" for name, what, _ in subs]
    for name, what, sub in subs:
        out += ["", f"### `shardfuzz {name}`", "", _cell(what) + "."]
        exclusive = {a.dest for g in sub._mutually_exclusive_groups for a in g._group_actions}
        rows = []
        for a in sub._actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            names = ", ".join(f"`{o}`" for o in a.option_strings) or _value(a)
            value = (
                _value(a)
                if a.option_strings
                else {"+": "one or more", "*": "any number"}.get(str(a.nargs), "")
            )
            rows.append(f"| {names} | {value} | {_default(a)} | {_what(a, exclusive)} |")
        if rows:
            out += ["", "| argument | value | default | what |", "|---|---|---|---|", *rows]
    return "\n".join(out) + "\n"


class _OptionRecorder:
    """Stands in for pytest's parser and option group: records what ``pytest_addoption`` declares."""

    def __init__(self) -> None:
        self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.ini: list[tuple[str, str, Any]] = []

    def getgroup(self, *_args: Any, **_kwargs: Any) -> _OptionRecorder:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.options.append((names, kwargs))

    def addini(self, name: str, help: str, default: Any = None, **_kwargs: Any) -> None:
        self.ini.append((name, help, default))


def pytest_options() -> str:
    """The ``--shardfuzz-*`` options and ini keys, from the plugin's own ``pytest_addoption``."""

    rec = _OptionRecorder()
    pytest_addoption(rec)  # type: ignore[arg-type]
    out = ["| option | value | default | what |", "|---|---|---|---|"]
    for names, kw in rec.options:
        choices = kw.get("choices")
        if choices is not None:
            value = " \\| ".join(f"`{c}`" for c in choices)
        else:
            value = f"`{_cell(kw.get('metavar') or names[0].lstrip('-').replace('-', '_').upper())}`"
        default = kw.get("default")
        shown = f"`{default}`" if default not in (None, [], False) else ""
        what = _cell(kw.get("help", ""))
        if kw.get("action") == "append" and "repeatable" not in what:
            what += " (repeatable)"
        out.append(f"| {', '.join(f'`{n}`' for n in names)} | {value} | {shown} | {what} |")
    if rec.ini:
        out += ["", "| ini key | what |", "|---|---|"]
        out += [f"| `{name}` | {_cell(what)} (the option wins over it) |" for name, what, _ in rec.ini]
    return "\n".join(out) + "\n"


def profiles() -> str:
    """The shardfuzz Hypothesis profiles and their budgets (what else they set depends on the
    profile that was active when they were registered: the prose says it)."""

    register_profiles()
    out = ["| profile | examples a run |", "|---|---|"]
    out += [f"| `{name}` | {settings.get_profile(name).max_examples} |" for name in PROFILES]
    return "\n".join(out) + "\n"


# -- environment variables, finding kinds, the failure file -----------------------------------


def environment() -> str:
    """Every environment variable shardfuzz reads: its own (``SHARDFUZZ_*``) and the others."""

    out = ["| variable | value | default | what |", "|---|---|---|---|"]
    for v in ENVIRONMENT:
        out.append(
            f"| `{v.name}` | {_cell(v.kind)} | {f'`{v.default}`' if v.default else ''} | {_cell(v.meaning)} |"
        )
    out += [
        "",
        "Read but not shardfuzz's own:",
        "",
        "| variable | what shardfuzz does with it |",
        "|---|---|",
    ]
    out += [f"| `{v.name}` | {_cell(v.meaning)} |" for v in OTHER_ENVIRONMENT]
    return "\n".join(out) + "\n"


#: what a report of each finding kind holds (the classes' docstrings say what the kind is)
REPORT_HOLDS = {
    "mismatch": "per output: mismatched elements k/n, greatest absolute and relative difference and where "
    "(global index), which rank's shard holds them, the worst elements with their tolerance, and a map of "
    "where the wrong elements sit",
    "layout": "every rank whose local shape or dtype is not what the layout says",
    "rank-error": '"Rank i terminated with the following error" and that rank\'s traceback, stdout and '
    "stderr (also for a rank that died, e.g. a segfault, with faulthandler's dump), and the first divergent "
    "collective; an implementation that returns something other than a dict of outputs gets the one line "
    "that says so (ImplementationReturnError), not shardfuzz's own frames",
    "hang": "the first divergent collective, which ranks finished and which did not, their CPU time, every "
    "rank's Python stack (faulthandler on SIGUSR1) and any collective that timed out inside a rank",
    "ignored-collective": "autograd went through a raw collective that has no autograd kernel and treated it as "
    "the identity (pytorch/pytorch#152127)",
    "communication": "the values were right, but a rank sent more than the implementation's declared budget: "
    "which rank, how far over, and the accounting table",
}


def _finding_classes() -> dict[str, type]:

    found: dict[str, type] = {}
    todo = list(Finding.__subclasses__())
    while todo:
        cls = todo.pop()
        found.setdefault(cls.kind, cls)
        todo += cls.__subclasses__()
    return found


def kinds() -> str:
    """The finding kinds (:data:`shardfuzz.spec.records.KINDS`), their classes and reports."""
    classes = _finding_classes()
    out = ["| kind | class | what it means | what the report holds |", "|---|---|---|---|"]
    for kind in KINDS:
        cls = classes[kind]
        doc = re.sub(r":\w+:`~?(?:[\w.]*\.)?(\w+)`", r"`\1`", (cls.__doc__ or "").strip().split("\n\n")[0])
        out.append(f"| `{kind}` | `shardfuzz.{cls.__name__}` | {_cell(doc)} | {_cell(REPORT_HOLDS[kind])} |")
    return "\n".join(out) + "\n"


#: what each field of a failure file holds (``shardfuzz.engine.failure_schema.SCHEMA`` checks them)
FAILURE_FIELDS = {
    "format": '`"shardfuzz-failure"`: a file of another tool is refused',
    "version": "the format version (a file without it is version 1; a newer one is refused)",
    "target": "the target's name",
    "target_ref": "the target by import reference (`pkg.mod:ATTR`)",
    "target_worker_ref": "where the ranks import the target from",
    "impl": "the implementation's name",
    "impl_ref": "the implementation by import reference (`pkg.mod:func`)",
    "impl_kwargs": "the arguments it was bound with (`bind`)",
    "files": "target and implementation files: absolute path and path relative to the project root",
    "case": "the shrunk case's fields",
    "case_repr": "the case as `Case(...)`",
    "backend": "`gloo` or `nccl`",
    "device": "`cpu` or `cuda`",
    "rank_servers": "on rank servers (`--ranks`): the rule that chose the case's ranks (`first`: the "
    "first `world_size` of the torchrun world) and that world's size; a replay with `--ranks` uses it",
    "deterministic": "whether the ranks ran with deterministic algorithms",
    "kind": "the finding kind",
    "ratio": "the greatest error/tolerance (mismatches)",
    "report": "the report, as printed",
    "trace": "each rank's collective trace",
    "inputs_sha256": "sha256 of the generated inputs (replay says when they changed)",
    "impl_source_sha256": "sha256 of the implementation's source (replay says when it changed)",
    "impl_file_sha256": "sha256 of the file that defines the implementation (replay says when it changed: a helper the implementation calls may have)",
    "tolerance": "the tolerance policy and its overrides (`--tolerance`)",
    "numerics": "the numerics flags of the driver and of rank 0 (TF32, reduced-precision reductions, SDPA "
    "backends, deterministic algorithms)",
    "versions": "torch, shardfuzz, Hypothesis and Python versions",
    "planted": "whether the implementation is one of the target's planted bugs",
    "origin": "the pytest test and the pytest-xdist worker that wrote it",
    "signature": "the finding's signature (what tells it from another finding)",
    "signature_version": "the version of the signature rule it was made with",
    "site": "the finding's site (wrong outputs and ranks, or the cause frame and message)",
    "writer": "the process that wrote it, as `HOST:BOOT:PID:RANDOM` where HOST and BOOT are hashes of the "
    "machine's id and name and of its boot (no machine is named): a later run updates the file only "
    "when that process is gone (or of an earlier boot)",
    "created": "when the file was first written",
    "updated": "when it was last rewritten (while shrinking)",
    "updates": "how many times it was rewritten",
}


def failure_fields() -> str:
    """The failure file's fields, from its schema (required first)."""

    out = ["| field | required | what |", "|---|---|---|"]
    for name, (required, _check) in SCHEMA.items():
        out.append(f"| `{name}` | {'yes' if required else ''} | {_cell(FAILURE_FIELDS[name])} |")
    return "\n".join(out) + "\n"


# -- the built-in targets ----------------------------------------------------------------------


def target_page(name: str, root: pathlib.Path = ROOT) -> pathlib.Path:
    return root / "docs" / "targets" / f"{name}.md"


def targets(base: pathlib.Path) -> str:
    """The built-in targets, each linked to its page (links relative to ``base``)."""
    out = [
        "| target | what | implementations | planted bugs | expected failures | verified to pass |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(builtin_targets()):
        t = get_target(name)
        link = _rel(base, target_page(name))
        out.append(
            f"| [`{name}`]({link}) | {_cell(t.description)} | {len(t.implementations)} "
            f"| {len(t.planted)} | {len(t.expected_failures)} | {len(t.verified)} |"
        )
    return "\n".join(out) + "\n"


# -- CONTRIBUTING.md's figures -----------------------------------------------------------------


def _reference_examples(root: pathlib.Path) -> list[tuple[str, int]]:
    """``tests/test_targets.py``'s reference examples per dtype, read from its parametrize."""
    tree = ast.parse((root / "tests" / "test_targets.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "test_reference_has_no_false_positives":
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize":
                    names = ast.literal_eval(dec.args[0])
                    if names == "dtype,examples":
                        return [tuple(x) for x in ast.literal_eval(dec.args[1])]
    raise LookupError("tests/test_targets.py: no test_reference_has_no_false_positives(dtype, examples)")


def _generic_triggers(root: pathlib.Path) -> tuple[str, ...]:
    tree = ast.parse((root / "tests" / "test_targets.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "GENERIC" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise LookupError("tests/test_targets.py: no GENERIC triggers")


def contributing_proofs(root: pathlib.Path = ROOT) -> str:
    """What ``tests/test_targets.py`` proves of every built-in target, with the figures it runs."""

    register_profiles()
    ci = settings.get_profile("shardfuzz-ci").max_examples
    slope, base = budget(1) - budget(0), budget(0)
    counts = [f"{n} in {dtype}" for dtype, n in _reference_examples(root)]
    examples = counts[0].replace(" in ", " examples in ", 1) + "".join(
        f"{', ' if i < len(counts) - 1 else ' and '}{c}" for i, c in enumerate(counts[1:], 1)
    )
    generic = ", ".join(f"`{t}`" for t in _generic_triggers(root))
    return (
        f"- each planted bug and expected failure is found within `{slope} * p95 + {base}` examples "
        f"(`shardfuzz.frontends.testing.budget`) under `shardfuzz-ci` ({ci} examples a run, "
        "derandomized), with the expected kind and shrunk structure, and prints its margin;\n"
        f"- the reference passes {examples} (`test_reference_has_no_false_positives`; the "
        "2,000-example runs are `pytest -m slow` and `benchmarks/no_false_positives.py`);\n"
        f"- the strategy reaches every declared trigger and the generic ones ({generic});\n"
        "- the declared `gradients` are outputs of the cases that reach backward.\n"
    )


def dtensor_ops_generated() -> str:
    """What ``dtensor_ops`` draws from this torch's DTensor registry, and what it skips, by reason."""
    from importlib.metadata import version

    module = sys.modules[get_target("dtensor_ops").inputs.__module__]
    families = ", ".join(f"{len(ops)} {name}" for name, ops in module.FAMILIES.items())
    skipped = sorted(module.SKIPPED.items(), key=lambda kv: (-kv[1], kv[0]))
    rows = "".join(f"| {_cell(reason)} | {n} |\n" for reason, n in skipped)
    # the names, for --option op=... (a user pinning a family listed them from Python)
    names = "".join(
        f"- {name} ({len(ops)}): " + ", ".join(f"`{spec.name}`" for spec in ops) + "\n"
        for name, ops in module.FAMILIES.items()
    )
    return (
        f"torch {version('torch').split('+')[0]}: {len(module.OPS)} ops drawn ({families}), "
        f"{sum(module.SKIPPED.values())} skipped.\n\n| skipped because | ops |\n|---|---|\n{rows}\n"
        "The ops drawn, by family (pin one with `--option op=NAME`; `--impl torch_dtensor` runs DTensor "
        f"on it, the default implementation is shardfuzz's own reference):\n\n{names}"
    )


def dtensor_ops_known() -> str:
    """``dtensor_ops``' known failures of ``torch_dtensor`` (its ``KNOWN``) by name, and as the
    ``--exclude`` flags of a campaign that sets them all aside, ready to paste."""
    module = sys.modules[get_target("dtensor_ops").inputs.__module__]
    names = "".join(f"- {name}: `{expr}`\n" for name, expr in module.KNOWN.items())
    flags = " \\\n".join(f"  --exclude {_double_quoted(expr)}" for expr in module.KNOWN.values())
    command = "shardfuzz fuzz dtensor_ops --impl torch_dtensor --duration 30m \\\n" + flags
    return f"{names}\n```bash\n{command}\n```\n"


def _double_quoted(text: str) -> str:
    """``text`` as one shell word: in double quotes where nothing in it is special there (the
    expressions' single quotes read as they are), else as :func:`shlex.quote` writes it."""
    return f'"{text}"' if not set(text) & set('"$`\\!') else shlex.quote(text)


#: key of ``<!-- shardfuzz:gen KEY -->`` -> its generator, given the folder of the file it is in
GENERATORS: dict[str, Callable[[pathlib.Path], str]] = {
    "cli": lambda _base: cli_options(),
    "pytest-options": lambda _base: pytest_options(),
    "profiles": lambda _base: profiles(),
    "environment": lambda _base: environment(),
    "kinds": lambda _base: kinds(),
    "failure-fields": lambda _base: failure_fields(),
    "targets": targets,
    "contributing-proofs": lambda _base: contributing_proofs(),
    "dtensor-ops-generated": lambda _base: dtensor_ops_generated(),
    "dtensor-ops-known": lambda _base: dtensor_ops_known(),
}


def render(text: str, path: pathlib.Path | str | None = None) -> str:
    """``text`` (of the doc at ``path``; default the README) with every generated section regenerated."""
    base = pathlib.Path(path).resolve().parent if path is not None else ROOT

    def gen(m: re.Match[str]) -> str:
        key = m.group(2)
        if key not in GENERATORS:
            raise KeyError(f"<!-- shardfuzz:gen {key} -->: unknown; known: {', '.join(GENERATORS)}")
        return m.group(1) + GENERATORS[key](base) + m.group(4)

    text = MARKER.sub(lambda m: m.group(1) + table(get_target(m.group(2))) + m.group(4), text)
    text = VERIFIED.sub(lambda m: m.group(1) + verified_table(get_target(m.group(2))) + m.group(4), text)
    return GENERATED.sub(gen, text)


def marked(text: str) -> list[str]:
    """The targets whose tables ``text`` holds."""
    return [m.group(2) for m in MARKER.finditer(text)]


def generated(text: str) -> list[str]:
    """The generated sections (keys) ``text`` holds."""
    return [m.group(2) for m in GENERATED.finditer(text)]


def drifted(files: Sequence[pathlib.Path] | None = None) -> list[str]:
    """The docs whose generated sections differ from what the code generates now."""
    return [str(p) for p in files or doc_files() if render(text := p.read_text(), p) != text]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m shardfuzz.frontends.doc_tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--write",
        metavar="FILE",
        nargs="*",
        default=None,
        help="rewrite the generated sections of FILE in place (default: every doc)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 naming the docs whose sections drifted")
    args = p.parse_args(argv)
    if args.check:
        bad = drifted()
        for name in bad:
            print(f"{name}: generated sections out of date; run: {REGENERATE}")
        return 1 if bad else 0
    if args.write is not None:
        for path in [pathlib.Path(f) for f in args.write] or doc_files():
            text = path.read_text()
            new = render(text, path)
            if new != text:
                path.write_text(new)
            print(f"{path}: {len(marked(text))} target tables, {len(generated(text))} generated sections")
        return 0
    for name in sorted(builtin_targets()):
        print(f"<!-- shardfuzz:table {name} -->\n{table(get_target(name))}<!-- /shardfuzz:table -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
