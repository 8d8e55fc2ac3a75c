"""Every implementation a built-in target records as verified to pass (its ``Verified`` records:
PyTorch's own TP, SP, FSDP2, context-parallel ring, loss_parallel, redistribute, collectives, DDP
and pipelining, each restricted to what it supports), run under its record's settings.

One test per record and dtype, ``shardfuzz-ci`` settings, the record's examples:

* nothing is found, and every example passed (none rejected in its place);
* every condition the record names is reached by cases that passed (``reaches``: the target's
  triggers; ``also_reaches``: the record's own predicates);
* every refusal it names was counted (``refuses``): what it does not support is rejected loudly;
* its known failures (``exclude``) were set aside, counted.

The expected failures of the same implementations are proved by tests/test_targets.py;
``benchmarks/torch_impls.py`` runs these records with more examples and fresh seeds.
"""

from __future__ import annotations

import dataclasses

import pytest

import shardfuzz
from shardfuzz import Case, Runner, Unsupported
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target
from shardfuzz.targets.tp_mlp import TORCH_TP_SIZE1_REFUSAL
from shardfuzz.targets.vocab_parallel import LOSS_PARALLEL_KNOWN

TARGETS = {name: get_target(name) for name in sorted(BUILTIN_TARGETS)}
VERIFIED = [
    pytest.param(t, name, dtype, id=f"{t}-{name}-{dtype}")
    for t, target in TARGETS.items()
    for name, rec in target.verified.items()
    for dtype in rec.dtypes
]


class PassedCases(shardfuzz.RunHooks):
    """The cases that passed: a case passed when the run's pass count grew while it ran (read when
    the next example starts, and at the end)."""

    def __init__(self) -> None:
        self.cases: list[Case] = []
        self._running: tuple[Case, int] | None = None

    def before_example(self, runner, case):
        self.settle(runner.stats)
        self._running = (case, runner.stats.passed)

    def settle(self, stats) -> None:
        if self._running is not None and stats.passed > self._running[1]:
            self.cases.append(self._running[0])
        self._running = None


def test_every_target_with_torch_implementations_records_them():
    """The records are where the verified implementations live (nothing hand-listed elsewhere)."""
    records = {f"{t}:{n}" for t, target in TARGETS.items() for n in target.verified}
    assert len(records) == 15, sorted(records)
    assert len(VERIFIED) == sum(len(t.verified[n].dtypes) for t in TARGETS.values() for n in t.verified)


@pytest.mark.parametrize("target,name,dtype", VERIFIED)
def test_verified_implementation_passes_and_reaches_what_its_record_names(target, name, dtype):
    rec = TARGETS[target].verified[name]
    passed = PassedCases()
    result = shardfuzz.run(
        target,
        name,
        profile="shardfuzz-ci",
        database=None,
        max_examples=rec.examples,
        dtypes=(dtype,),
        options=rec.options,
        exclude=rec.exclude,
        world_sizes=rec.world_sizes,
        hooks=[passed],
    )
    summary = result.stats.summary()
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= rec.examples, summary
    passed.settle(result.stats)
    assert len(passed.cases) == result.stats.passed, summary
    unreached = [t for t in rec.reaches if result.stats.triggers[t] <= 0]
    unreached += [label for label, met in rec.also_reaches.items() if not any(map(met, passed.cases))]
    assert not unreached, f"{target}:{name} ({dtype}) never reached {unreached}:\n{summary}"
    unseen = [r for r in rec.refuses if result.stats.unsupported[r] <= 0]
    assert not unseen, f"{target}:{name} ({dtype}) was never seen refusing {unseen}:\n{summary}"
    if rec.exclude:
        assert sum(result.stats.excluded.values()) > 0, summary  # set aside, counted
    print(f"{target}:{name} ({dtype}): {summary}")  # the closest pass, with its case


# -- what the records do not say ------------------------------------------------------------------
def test_a_refused_case_is_refused_outside_hypothesis_too():
    """torch TP's DTensor plan on a sharded dim of global size 1 (its expected failure
    torch_tp_dtensor_size1) raises Unsupported from Runner.run_case; one size up it passes."""
    case = Case(
        target="tp_mlp",
        world_size=1,
        mesh=(1,),
        sizes=dict(batch=1, seq=1, d_model=1, hidden=1, d_out=1),
        split=("hidden",),
    )
    with pytest.raises(Unsupported, match="sharded dim has global size 1") as e:
        Runner("tp_mlp", "torch_tp_dtensor").run_case(case)
    assert e.value.reason == TORCH_TP_SIZE1_REFUSAL
    wider = dataclasses.replace(case, sizes={**case.sizes, "hidden": 2})
    assert Runner("tp_mlp", "torch_tp_dtensor").run_case(wider) < 1


def test_fsdp2_hsdp_keeps_one_mesh_per_case_group_when_the_timeout_changes():
    """The engine makes a case's groups per timeout; HSDP's 2 x 2 mesh, kept per ranks, was made
    again at each change back and forth (two more groups each time): a leak to the rank's check,
    and a restarted pool, up to 5 times a test in the ci suite as timeouts adapted to load."""
    case = Case(
        target="zero_adamw_torch", world_size=4, mesh=(4,), sizes={"p0": 1, "p1": 1, "p2": 1},
        split=("p0", "p1", "p2"),
        options={"clip_factor": None, "bucket_view": False, "empty_param": False, "steps": 1, "grad_accum": 1},
    )  # fmt: skip
    leaks: dict = {}
    for fixed in (5.0, 50.0, 5.0):  # two hard caps (120 s, 500 s): two sets of case groups
        runner = Runner("zero_adamw_torch", "fsdp2_hsdp", shardfuzz.RunConfig(timeout=fixed))
        assert runner.run_case(case) < 1
        leaks.update(runner.stats.leaks)
    assert leaks == {}


def test_unpinned_cases_torch_cannot_run_are_refused_and_counted():
    """loss_parallel without its record's pinned options: the rules and smoothings it does not
    implement are refused by name, never passed."""
    result = shardfuzz.run(
        "vocab_parallel",
        "torch_loss_parallel",
        profile="shardfuzz-ci",
        database=None,
        max_examples=10,
        exclude=tuple(LOSS_PARALLEL_KNOWN.values()),
    )
    assert not result.found, result.report
    assert result.stats.unsupported["rule"] > 0 and result.stats.unsupported["smoothing"] > 0


def test_a_verified_record_is_checked_when_made():
    from shardfuzz.spec.records import Verified

    ok = dict(name="torch_x", what="torch's X", examples=10)
    for change, message in [
        (dict(name="torch x"), "name must be the identifier"),
        (dict(what=""), "say in one line what it is"),
        (dict(examples=0), r"examples=0; expected an int >= 1"),
        (dict(dtypes=("float8",)), r"dtypes=\('float8',\); expected distinct ones of"),
        (dict(options={"grid": [2, 2]}), r"options=\{'grid': \[2, 2\]\}; \{'grid': \[2, 2\]\} must be str"),
        (dict(dtypes=("float32", "float32")), r"expected distinct ones of"),
        (dict(world_sizes=(True, 2)), r"world_sizes=\(True, 2\); expected a tuple of ints in \[1, 16\]"),
        (dict(world_sizes=(64,)), r"world_sizes=\(64,\)"),
        (dict(also_reaches=[print]), r"also_reaches=\[.*\]; expected a mapping of labels"),
        (dict(reaches="uneven"), r"reaches='uneven'; expected a tuple of strings"),
        (dict(world_sizes=(0,)), r"world_sizes=\(0,\); expected a tuple of ints in \[1, 16\]"),
        (dict(also_reaches={"x": 1}), r"also_reaches\['x'\]=1; expected a label and a predicate"),
    ]:
        with pytest.raises(shardfuzz.TargetError, match=message):
            Verified(**{**ok, **change})
    tp = TARGETS["tp_mlp"]
    with pytest.raises(shardfuzz.TargetError, match=r"verified names 'torch_tp'.*may pass: reference, "):
        dataclasses.replace(tp, verified=[Verified(**{**ok, "name": "torch_tp"})])  # an expected failure
