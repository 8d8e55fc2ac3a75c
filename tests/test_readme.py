"""The README and docs/ stay true: their examples are the files we test, CI runs their test command,
every list or table the code knows is generated from it, and every link resolves."""

import pathlib
import re

import pytest

from shardfuzz.frontends import doc_tables
from shardfuzz.frontends.doc_tables import REGENERATE, doc_files, generated, marked, render, target_page
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = {p.relative_to(ROOT).as_posix(): p.read_text() for p in doc_files(ROOT)}
ALL_TEXT = "\n".join(DOCS.values())


def test_readme_is_short():
    assert len(README.splitlines()) <= 150, "the README is the front page: move the rest into docs/"


def test_tutorial_example_is_the_tested_file():
    tutorial = DOCS["docs/tutorial/write-a-target.md"]
    assert (ROOT / "examples" / "mean_target.py").read_text().strip() in tutorial


def test_ci_runs_the_readme_test_command():
    command = "pytest --hypothesis-profile=ci"
    assert f"```bash\n{command}\n```" in README
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci
    assert ci.index('python -m pip install --quiet "torch==2.13.0"') < ci.index(
        'python -m pip install --quiet -e ".[dev]"'
    )


def test_derive_example_is_the_tested_file():
    """The derive() line in the docs is the one tests/test_config.py runs."""
    line = 'MINE = tp_mlp.TARGET.derive("my_tp", implementations={"mine": "my_tp_mlp"})'
    assert line in DOCS["docs/tutorial/write-a-target.md"]
    assert line in (ROOT / "tests" / "data" / "derived_target.py").read_text()


@pytest.mark.parametrize("name", sorted(DOCS))
def test_generated_sections_match_the_code(name):
    text = DOCS[name]
    assert render(text, ROOT / name) == text, (
        f"{name}: a generated section no longer matches the code; regenerate every doc with: {REGENERATE}"
    )


def test_every_built_in_target_has_a_page_with_its_records():
    for name in BUILTIN_TARGETS:
        page = target_page(name, ROOT)
        assert page.exists(), f"{name}: no {page.relative_to(ROOT)}; copy a target page and run: {REGENERATE}"
        text = page.read_text()
        t = get_target(name)
        if t.planted or t.expected_failures:
            assert marked(text) == [name], f"{page.relative_to(ROOT)}: needs <!-- shardfuzz:table {name} -->"
        verified = f"<!-- shardfuzz:verified {name} -->\n"
        assert verified in text, f"{page.relative_to(ROOT)}: needs the verified implementations' section"
        end = text.rfind("<!-- /shardfuzz:table -->")
        assert end < text.index(verified), f"{page.relative_to(ROOT)}: verified section goes after the tables"
    tables = [n for text in DOCS.values() for n in marked(text)]
    assert sorted(tables) == sorted(
        n for n in BUILTIN_TARGETS if get_target(n).planted or get_target(n).expected_failures
    )


def test_every_generator_has_its_section():
    """Each generated list lives somewhere: deleting a section is drift too."""
    present = {key for text in DOCS.values() for key in generated(text)}
    assert present == set(doc_tables.GENERATORS), set(doc_tables.GENERATORS) ^ present
    assert "targets" in generated(README)
    assert "contributing-proofs" in generated(DOCS["CONTRIBUTING.md"])


def test_the_verified_section_is_generated_from_the_records():
    """A hand-written row in a target's verified section is drift: it is rewritten from the
    records (a record's name, its settings and what it must reach all appear)."""
    text = "<!-- shardfuzz:verified tp_mlp -->\nhand text | kept\n<!-- /shardfuzz:verified -->\n"
    out = render(text)
    assert "hand text" not in out and "| `torch_sp_dtensor` |" in out, out
    assert "40 examples in each of float32, bfloat16" in out and "`2-D mesh`" in out, out
    assert "`not sequence parallel`" in out, out
    assert "None recorded" in render(text.replace("tp_mlp", "moe"))


def test_the_target_spec_names_everything_an_implementation_gets_in_ctx():
    """Every field and public method of the rank context is in the target spec as ``ctx.NAME`` (a
    new user looked for ``ctx.case`` to read a drawn option and did not find it)."""
    import dataclasses

    from shardfuzz.ranks.task import RankContext

    names = {f.name for f in dataclasses.fields(RankContext)}
    names |= {n for n in vars(RankContext) if not n.startswith("_") and callable(getattr(RankContext, n))}
    names |= {n for n, v in vars(RankContext).items() if isinstance(v, property)}
    spec = DOCS["docs/reference/target-spec.md"]
    missing = sorted(n for n in names if f"`ctx.{n}" not in spec)
    assert not missing, f"docs/reference/target-spec.md does not name ctx.{', ctx.'.join(missing)}"


def test_the_strategies_reference_names_every_argument_of_sst_cases():
    import inspect

    import shardfuzz.strategies as sst

    doc = DOCS["docs/reference/strategies.md"]
    missing = [n for n in list(inspect.signature(sst.cases).parameters)[1:] if f"`{n}=`" not in doc]
    assert not missing, f"docs/reference/strategies.md does not name sst.cases' {missing}"


def test_every_environment_variable_the_source_reads_is_documented():
    from shardfuzz.limits import ENVIRONMENT, OTHER_ENVIRONMENT

    pattern = re.compile(
        r"""(?:environ(?:\.get|\.setdefault|\.pop)?\(\s*|environ\[\s*|getenv\(\s*)["']([A-Z][A-Z0-9_]*)["']"""
        r"""|["']([A-Z][A-Z0-9_]*)["']\s+(?:not\s+)?in\s+os\.environ"""
    )
    read = {
        a or b for path in (ROOT / "shardfuzz").rglob("*.py") for a, b in pattern.findall(path.read_text())
    }
    documented = {v.name for v in (*ENVIRONMENT, *OTHER_ENVIRONMENT)}
    assert read and read <= documented, (
        f"read in shardfuzz/ but in neither shardfuzz.limits.ENVIRONMENT nor OTHER_ENVIRONMENT: {read - documented}"
    )
    # shardfuzz's own are checked both ways by tests/test_config.py; NO_COLOR is rich's to read
    others = {v.name for v in OTHER_ENVIRONMENT} - {"NO_COLOR"}
    assert others <= read, f"in OTHER_ENVIRONMENT but read nowhere: {others - read}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    out, fence = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#+ (.*)", line)):
            out.add(_slug(m.group(1)))
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _links(text: str):
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield m.group(1) or m.group(2)


@pytest.mark.parametrize("name", sorted(DOCS))
def test_relative_links_resolve(name):
    here = (ROOT / name).parent
    broken = []
    for link in _links(DOCS[name]):
        if re.match(r"[a-z]+:", link) or "(" in link:
            continue  # http(s) and mailto: not checked here; "(" is a table's text, as in f32[1](S(2))
        path, _, anchor = link.partition("#")
        target = (here / path).resolve() if path else ROOT / name
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text()):
            broken.append(link)
    assert not broken, f"{name}: links to nothing: {broken}"
