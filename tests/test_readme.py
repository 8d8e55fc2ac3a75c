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


def test_readme_lists_every_planted_bug():
    from shardfuzz.registry import BUILTIN_TARGETS, get_target

    for name in BUILTIN_TARGETS:
        assert f"**`{name}`**" in README
        for bug in get_target(name).planted:
            assert f"`{bug}`" in README, bug
