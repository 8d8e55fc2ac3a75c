"""Every registered built-in target, proved from its own records.

A target file declares its planted bugs (:class:`~shardfuzz.PlantedBug`), expected failures
(:class:`~shardfuzz.ExpectedFailure`), triggers and gradients; this one module turns them into
tests, so a new built-in target needs no test file of its own:

* every planted bug and expected failure is found and shrunk to its declared structure, within
  ``2 * p95 + 10`` examples of the ``shardfuzz-ci`` settings (derandomized, database off);
* the reference passes 45 examples in float32 and 45 in bfloat16 (float64: 20), no false positive
  (the 2,000- and 10,000-example runs are ``benchmarks/no_false_positives.py``);
* the strategy reaches every declared trigger and the generic ones every target must reach;
* backward is checked: the declared gradients are outputs of the cases that reach ``backward``;
* under 5% of the strategy's random cases give a degenerate output (all zero or constant, or a
  softmax saturated to one-hot: inputs that hide bugs).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import find, settings

import shardfuzz
from shardfuzz.engine import covering
from shardfuzz.engine.degenerate import degenerate_share
from shardfuzz.frontends.testing import assert_reference_passes
from shardfuzz.spec import sampling
from shardfuzz.spec.bounds import bounds_of
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target
from shardfuzz.spec.triggers import triggers_of

TARGETS = {name: get_target(name) for name in sorted(BUILTIN_TARGETS)}
PLANTED = [(t, bug) for t in TARGETS for bug in TARGETS[t].planted]
EXPECTED = [(t, name) for t in TARGETS for name in TARGETS[t].expected_failures]
#: what every built-in target's strategy must reach (docs/triggers.md)
GENERIC = (
    "world>=3",
    "group>=3",
    "group<world",
    "2-D mesh",
    "uneven",
    "tensor_split != DTensor shards",
    "bfloat16",
    "float64",
    "profile=ties",
)
TRIGGERS = [(t, trig) for t in TARGETS for trig in (*GENERIC, *TARGETS[t].triggers)]
FIND = settings(max_examples=3000, database=None, deadline=None)


def _pool(target: str) -> list:
    """The covering pool: 250 random draws, drawn once per session (the covering rows of every
    run of the target are picked from the same pool)."""
    return [c for c, _ in covering.pool_for(TARGETS[target])]


def _sizes_drawn(target) -> set[str]:
    """The size names a target's cases carry: those its strategy declares (``bounds_of``, read
    without a draw; every built-in target declares them, and carries them, as the test below
    checks). At collection, in every xdist worker: drawing the covering pools there took 1.5 CPU-s
    a process (``find``, before them, ~1.3 s a target)."""
    return {name for b in bounds_of(target.strategy()) for name, _ in b.sizes}


def test_the_size_names_a_strategy_declares_are_those_its_cases_carry():
    """What ``_sizes_drawn`` reads at collection is what the target draws (its covering pool)."""
    for name, t in TARGETS.items():
        declared = bounds_of(t.strategy())
        assert declared is not None, f"{name} declares no bounds"
        assert {n for b in declared for n, _ in b.sizes} == {n for c in _pool(name) for n in c.sizes}, name


def _id(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


def _planted_params():
    """The planted bugs; the hangs (about 30 s each: every shrink step waits out a timeout) run
    with ``pytest -m slow``, and the ci suite proves hang findings on toy targets
    (tests/test_reliability.py, tests/test_interrupts.py)."""
    for t, bug in PLANTED:
        slow = "hang" in TARGETS[t].planted[bug].expect.kinds
        yield pytest.param(t, bug, id=_id((t, bug)), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("target,bug", list(_planted_params()))
def test_planted_bug_is_found_and_shrunk(target, bug, proof):
    proof(target, bug)  # assert_planted_bug_found, once per session


def _expected_params():
    """The expected failures; the hangs, the searches that pass through hangs (a fixed
    ``timeout``) and the long searches (a p95 of 10 examples or more: torch's loss_parallel needs
    class weights, ignored labels and 2 ranks at once) run with ``pytest -m slow``, as the planted
    hangs do."""
    for t, name in EXPECTED:
        rec = TARGETS[t].expected_failures[name]
        expect = rec.expect
        slow = expect.kind == "hang" or expect.timeout is not None or rec.p95 >= 10
        yield pytest.param(t, name, id=_id((t, name)), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("target,name", list(_expected_params()))
def test_expected_failure_is_found_and_shrunk(target, name, proof):
    proof(target, name)  # assert_planted_bug_found, once per session (test_standalone reuses it)


# the ci budget: the 2,000- and 10,000-example runs are benchmarks/no_false_positives.py
@pytest.mark.parametrize("dtype,examples", [("float32", 45), ("bfloat16", 45), ("float64", 20)])
@pytest.mark.parametrize("target", list(TARGETS))
def test_reference_has_no_false_positives(target, dtype, examples):
    assert_reference_passes(target, dtype, examples=examples)


@pytest.mark.parametrize("target,trigger", TRIGGERS, ids=map(_id, TRIGGERS))
def test_strategy_reaches_trigger(target, trigger):
    t = TARGETS[target]
    reaches = lambda c: trigger in triggers_of(t, c) and not (t.supports and t.supports(c))
    if any(reaches(c) for c in _pool(target)):  # the covering pool: 250 random draws, shared
        return
    # a rare conjunction (a value drawn 2.5% of the time, on 3 ranks): 2,000 more random draws,
    # deterministic (covering's draws ignore the loaded modules' constants, which find() uses)
    more = sampling.draw_pool(t.strategy(), sampling.stable_seed(f"{target}/reach"), 2000)
    if any(reaches(c) for c, _ in more):
        return
    find(t.strategy(), reaches, settings=FIND)  # raises when no case reaches it


@pytest.mark.parametrize("target", [t for t in TARGETS if TARGETS[t].gradients])
def test_backward_is_checked(target):
    t = TARGETS[target]
    cases = [c for c in _pool(target) if "backward" in triggers_of(t, c)]  # every one in the pool
    cases = cases or [find(t.strategy(), lambda c: "backward" in triggers_of(t, c), settings=FIND)]
    for case in cases:
        assert set(t.gradients) <= set(t.outputs_for(case)), (case, t.gradients, t.outputs_for(case))


#: targets without planted bugs of their own, and why
NO_PLANTED = {
    "dtensor_ops": "DTensor's operators are the implementation under test: its expected failures, "
    "found in torch 2.13, prove the target can fail",
    "zero_adamw_torch": "torch's ZeroRedundancyOptimizer is the implementation under test; "
    "the planted bugs of the ZeRO contract live in zero_adamw",
}


@pytest.mark.parametrize("target", list(TARGETS))
def test_few_random_cases_have_degenerate_outputs(target):
    t = TARGETS[target]
    found = degenerate_share(t, _pool(target))  # 250 random draws: the covering pool, shared
    assert found.cases >= 200, f"only {found.cases} supported cases drawn"
    assert found.share < 0.05, (
        f"{target}: {found.degenerate} of {found.cases} cases degenerate: {found.by_cause}"
    )


@pytest.mark.parametrize("target", [t for t in TARGETS if "batch" in _sizes_drawn(TARGETS[t])])
def test_batch_above_one_is_reached(target):
    t = TARGETS[target]
    if any("batch>1" in triggers_of(t, c) for c in _pool(target)):
        return
    find(t.strategy(), lambda c: "batch>1" in triggers_of(t, c), settings=FIND)  # raises if none


def test_every_target_has_planted_bugs_with_their_real_bug():
    for t in TARGETS.values():
        assert t.planted or t.name in NO_PLANTED, f"{t.name} has no planted bug"
        for rec in [*t.planted.values(), *t.expected_failures.values()]:
            assert rec.p95 >= 1 and rec.expect.kind, rec
            assert getattr(rec, "models", None) or getattr(rec, "reason", None), rec
        if t.planted:  # the shrunk case of each is checked to reach its needs
            assert any(len(b.expect.needs) >= 2 for b in t.planted.values()), (
                f"{t.name}: no planted bug needs two trigger conditions at once"
            )


@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_reference_has_no_false_positives_on_random_seeds(target):
    """A long measurement (``pytest -m slow``): 2000 examples with fresh seeds, every dtype drawn."""
    result = shardfuzz.run(target, profile="shardfuzz-fuzz", database=None, max_examples=2000)
    assert not result.found, result.report
    print(f"{target}: {result.stats.summary()}")


def test_an_expect_record_is_keyword_only_and_names_a_known_kind():
    from shardfuzz.spec.records import Expect

    with pytest.raises(TypeError, match="positional"):
        Expect("mismatch", 2, (2,))  # a record reads as what it says: every field by name
    with pytest.raises(shardfuzz.TargetError, match=r"Expect\(kind='wrong'\); allowed: mismatch"):
        Expect(kind="wrong", world_size=2, mesh=(2,))
    assert Expect(kind="mismatch", world_size=2, mesh=(2,)).kinds == ("mismatch",)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("uneven", True, r"expected a tuple of the split sizes that must be uneven .*e.g. \('batch',\)"),
        ("uneven", "seq", "expected a tuple of the split sizes"),  # not the letters s, e, q
        ("world_size", 0, "expected a world size >= 1, or a tuple of them"),
        ("world_size", (), "expected a world size >= 1"),
        ("mesh", 2, r"expected a mesh shape such as \(2,\)"),
        ("outputs", "grad_x", "expected a tuple of distinct output names"),
        ("check", "bfloat16", "expected a predicate on the case"),
        ("needs", "uneven", "expected a tuple of strings"),
        ("timeout", 0, "expected seconds > 0"),
    ],
)
def test_an_expect_field_of_the_wrong_type_is_refused_when_made(field, value, message):
    # found by a new user: Expect(uneven=True) was accepted, and the proof crashed with a TypeError
    # after its whole search
    from shardfuzz.spec.records import Expect

    fields = dict(kind="mismatch", world_size=2, mesh=(2,), note="says what check asks for")
    with pytest.raises(shardfuzz.TargetError, match=re.escape(f"Expect({field}={value!r}); ") + message):
        Expect(**{**fields, field: value})


def test_a_check_needs_a_note_and_a_known_failure_is_checked_whole_when_made():
    from shardfuzz.spec.records import Expect, ExpectedFailure, PlantedBug

    with pytest.raises(shardfuzz.TargetError, match="a check needs a note"):
        Expect(kind="mismatch", world_size=2, mesh=(2,), check=lambda c: True)
    with pytest.raises(shardfuzz.TargetError, match=r"Expect\(note=None\); expected a string"):
        Expect(kind="mismatch", world_size=2, mesh=(2,), note=None)
    ok = Expect(kind="mismatch", world_size=2, mesh=(2,))
    bad = {
        "name must be an identifier": dict(name="not a name"),
        "say in one line what it is": dict(what=" "),
        "expected an Expect": dict(expect="mismatch"),
        r"p95=0; expected the examples": dict(p95=0),
        "link='see the forum'; expected 'owner/repo#N'": dict(link="see the forum"),
        "impl=3; expected an implementation name": dict(impl=3),
    }
    for cls in (PlantedBug, ExpectedFailure):
        for message, change in bad.items():
            fields = {"name": "bug", "what": "a real bug", "expect": ok, "p95": 2, "link": "", "impl": None}
            fields.update(change)
            what = fields.pop("what")
            with pytest.raises(shardfuzz.TargetError, match=message):
                cls(fields.pop("name"), what, fields.pop("expect"), **fields)
    linked = PlantedBug("bug", "a real bug", ok, p95=2, link="zhuzilin/ring-flash-attention@9b84a6a")
    assert linked.description == "a real bug (zhuzilin/ring-flash-attention@9b84a6a)"


def test_a_notes_plain_facts_are_read_and_checked_against_a_case():
    from shardfuzz.spec.records import note_contradictions, note_facts

    assert note_facts("sequence parallel, seq 3 and bfloat16 (2 ranks)") == ["seq 3", "bfloat16", "2 ranks"]
    assert note_facts("stage 2 or 3, any size, not float64, stage >= 2") == []  # no single fact
    case = shardfuzz.Case(
        target="t", world_size=2, mesh=(2,), sizes={"seq": 3}, split=("seq",), dtype="bfloat16",
        options={"microbatches": 2, "logit_scale": 30.0, "causal": True},
    )  # fmt: skip
    assert note_contradictions("seq 3, bfloat16, 2 ranks, 2 micro-batches, logit_scale 30", case) == []
    assert note_contradictions("seq 2, float32, 3 ranks, 1 micro-batch, logit_scale 1", case) == [
        "seq 2", "float32", "3 ranks", "1 micro-batch", "logit_scale 1",
    ]  # fmt: skip
    # prose is not read: names the case does not carry, alternatives anywhere in the note, two dtypes
    assert note_contradictions("hidden 3, dim 0, 3 stages, 1 element", case) == []
    assert note_facts("3 ranks, or a wider vocab on 2") == note_facts("1 element (fast) or 2 (slow)") == []
    assert note_facts("bfloat16 and float32 alike") == [] and note_facts("hidden 1,024") == []
    assert note_contradictions("world_size 3", case) == ["world_size 3"]
    # "NAME N on M ranks" is two facts (a new user's "n 3 on 2 ranks" was read as none, and passed
    # a case of n 1); "on dim 0" is prose
    assert note_facts("seq 2 on 3 ranks") == ["seq 2", "3 ranks"] and note_facts("sharded on dim 0") == []
    assert note_contradictions("seq 2 on 3 ranks", case) == ["seq 2", "3 ranks"]


def test_the_notes_state_facts_their_proofs_confirm():
    """Most records' notes say something the proof's shrunk case confirms (assert_planted_bug_found):
    the reading of notes is not vacuous."""
    from shardfuzz.spec.records import note_facts

    records = [r for t in TARGETS.values() for r in (*t.planted.values(), *t.expected_failures.values())]
    read = [r.name for r in records if note_facts(r.expect.note)]
    assert len(read) >= len(records) // 3, read


def test_builtin_targets_are_discovered_from_their_files_as_a_full_parse_finds_them(tmp_path):
    """Every module-level ``X = Target(name=...)`` of targets/*.py is a built-in target, read without
    importing the file (no torch); the quick reading finds exactly what Python's parser finds."""
    import ast
    import importlib.util
    import pathlib
    import subprocess
    import sys

    from shardfuzz.spec.registry import builtin_targets, targets_in

    folder = pathlib.Path(importlib.util.find_spec("shardfuzz.targets").submodule_search_locations[0])
    parsed = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        assigned = {  # a module-level `X = Target(...)` / `X: T = Target(...)`: discoverable
            id(n.value): target.id
            for n in tree.body
            if isinstance(n, ast.Assign | ast.AnnAssign) and isinstance(n.value, ast.Call)
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(target, ast.Name)
        }
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            func = call.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) != "Target":
                continue
            named = [k.value for k in call.keywords if k.arg == "name"] + call.args[:1]
            name = (
                named[0].value
                if named and isinstance(named[0], ast.Constant)
                else f"<{path.name}:{call.lineno}>"
            )
            parsed[name] = f"shardfuzz.targets.{path.stem}:{assigned.get(id(call), '<not at module level>')}"
    assert builtin_targets() == parsed and len(parsed) == len(TARGETS) >= 11
    code = "import sys; from shardfuzz.spec.registry import builtin_targets; builtin_targets(); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
    (tmp_path / "mine.py").write_text('MINE = Target(\n    name="mine",\n    cases=None,\n)\n')
    (tmp_path / "typed.py").write_text(
        "TYPED: Target = shardfuzz.Target(  # a comment\n    name='typed',\n)\n"
    )
    assert targets_in([str(tmp_path)]) == {
        "mine": "shardfuzz.targets.mine:MINE",
        "typed": "shardfuzz.targets.typed:TYPED",
    }
    (tmp_path / "more.py").write_text('AGAIN = Target(name="mine")\n')
    with pytest.raises(shardfuzz.TargetError, match="built-in target 'mine' is defined twice"):
        targets_in([str(tmp_path)])


def test_the_margin_printed_with_a_proof_is_the_shrunk_cases_own(capsys):
    """``assert_planted_bug_found`` prints the shrunk case and its margin; the margin is that case's
    as a rerun judges it (the run's smallest over every failing example belonged to another case:
    27.8x printed beside a case that `shardfuzz case` judged 2.1e6x)."""
    from shardfuzz import Runner
    from shardfuzz.errors import Finding
    from shardfuzz.frontends.testing import assert_planted_bug_found

    rec = get_target("tp_mlp").planted["missing_f_backward"]
    result = assert_planted_bug_found("tp_mlp", "missing_f_backward", rec.expect, p95=rec.p95)
    printed = re.search(r", margin (\S+)x$", capsys.readouterr().out.strip())
    assert printed is not None
    with pytest.raises(Finding) as rerun:
        Runner("tp_mlp", "missing_f_backward").run_case(result.case)
    assert printed.group(1) == f"{rerun.value.ratio:.3g}"
