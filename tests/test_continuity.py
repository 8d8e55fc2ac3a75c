"""What users saved with an earlier shardfuzz still works: a failure file and an example database
written at 5a6d863 (before the engine moved into packages by stage, issue 22) by

    shardfuzz fuzz tp_mlp --impl missing_allreduce --profile shardfuzz-dev --max-examples 60

replay the same finding, and the database entries are found under the same key and replay it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from shardfuzz import RunConfig
from shardfuzz.case import Case
from shardfuzz.errors import Finding

DATA = Path(__file__).resolve().parent / "data" / "written_at_5a6d863"
FAILURE = DATA / "tp_mlp-missing_allreduce-gloo-mismatch.json"


def saved_case() -> Case:
    return Case.from_dict(json.loads(FAILURE.read_text())["case"])


def test_a_failure_file_written_before_the_move_replays_the_same_finding():
    from shardfuzz.engine.failures import load
    from shardfuzz.repro.replay import replay_one

    replayed = replay_one(load(str(FAILURE)))
    assert (replayed.status, replayed.kind) == ("still fails", "mismatch"), replayed.line()
    assert replayed.record["case"] == saved_case()


def test_a_database_written_before_the_move_is_found_under_the_same_key_and_replays(tmp_path):
    from shardfuzz.engine.database import keyed_database
    from shardfuzz.engine.runner import Runner
    from shardfuzz.engine.search import DATABASE_KEY, build_test, run_test, stable_identity

    shutil.copytree(DATA / "examples", tmp_path / "examples")
    db = DirectoryBasedExampleDatabase(str(tmp_path / "examples"))
    runner = Runner("tp_mlp", "missing_allreduce", RunConfig(failures_dir=None))
    saved = list(keyed_database(db, stable_identity(runner)).fetch(DATABASE_KEY))
    assert saved, f"no saved example under {stable_identity(runner)!r}: the database key changed"
    # no covering rows and no generation: only the saved examples run, so a finding is theirs
    only_saved = settings(database=db, phases=[Phase.reuse, Phase.shrink], max_examples=20, deadline=None)
    with pytest.raises(Finding) as found:
        run_test(build_test(runner, only_saved, rows=False))
    assert found.value.kind == "mismatch"
    assert found.value.case == saved_case(), f"replayed {found.value.case!r}, saved {saved_case()!r}"
