"""The README stays true: its example is the file we test, and CI runs its test command."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_example_is_the_tested_file():
    assert (ROOT / "examples" / "mean_target.py").read_text().strip() in README


def test_ci_runs_the_readme_test_command():
    command = "pytest --hypothesis-profile=ci"
    assert f"```bash\n{command}\n```" in README
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci
    assert ci.index('python -m pip install --quiet "torch==2.13.0"') < ci.index(
        'python -m pip install --quiet -e ".[dev]"'
    )


def test_readme_target_tables_are_generated_from_the_records():
    from shardfuzz.frontends.doc_tables import marked, render
    from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target

    with_records = [n for n in BUILTIN_TARGETS if get_target(n).planted or get_target(n).expected_failures]
    assert sorted(marked(README)) == sorted(with_records), "every target with records has a marked table"
    assert render(README) == README, "regenerate: python -m shardfuzz.frontends.doc_tables --write README.md"


def test_readme_derive_example_is_the_tested_file():
    """The derive() line in the README is the one tests/test_config.py runs."""
    line = 'MINE = tp_mlp.TARGET.derive("my_tp", implementations={"mine": "my_tp_mlp"})'
    assert line in README
    assert line in (ROOT / "tests" / "data" / "derived_target.py").read_text()
