"""One run configuration, declared hooks, bound implementations and derived targets."""

from __future__ import annotations

import collections
import dataclasses
import os

import pytest

import shardfuzz
from shardfuzz import Case, InvalidArgument, Mismatch, OutputTolerance, RunConfig, RunHooks, Runner, Tolerance
from shardfuzz.engine.covering import pool_for
from shardfuzz.engine.finding import inputs_hash
from shardfuzz.spec.registry import get_target

DATA = os.path.join(os.path.dirname(__file__), "data")
TOY = os.path.join(DATA, "toy_target.py")
DERIVED = os.path.join(DATA, "derived_target.py")


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"backend": "mpi"}, "backend='mpi'; allowed: gloo, nccl"),
        ({"backend": "nccl", "device": "cpu"}, "nccl needs device='cuda'"),
        ({"world_sizes": [0, 2]}, "world_sizes=[0, 2]"),
        ({"world_sizes": []}, "world_sizes=[]"),
        ({"timeout": 0}, "timeout=0; must be a finite number > 0"),
        ({"deadline": float("nan")}, "deadline=nan"),
        ({"max_examples": 1.5}, "max_examples=1.5; must be an int >= 1"),
        ({"dtypes": ["float8"]}, "dtypes=['float8']"),
        ({"profile": "ci"}, "profile='ci'; allowed: shardfuzz-ci"),
        ({"deterministic": "yes"}, "deterministic='yes'"),
    ],
)
def test_bad_configuration_is_a_named_error(kw, message):
    with pytest.raises(
        InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        RunConfig(**kw)


def test_device_default_rule_and_json_round_trip():
    assert RunConfig().device == "cpu" and RunConfig(backend="nccl").device == "cuda"
    cfg = RunConfig(world_sizes=(1, 3), timeout=7.5, dtypes=("bfloat16",), deadline=60.0, deterministic=True)
    assert RunConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(InvalidArgument, match="unknown field"):
        RunConfig.from_json('{"nope": 1}')


def test_run_refuses_a_config_and_its_fields_together():
    with pytest.raises(InvalidArgument, match="not both"):
        shardfuzz.run(TOY, config=RunConfig(), max_examples=3)
    with pytest.raises(InvalidArgument, match=r"unknown RunConfig field\(s\) \['max_example'\]"):
        shardfuzz.run(TOY, max_example=3)
    from hypothesis import settings

    with pytest.raises(InvalidArgument, match="give one or the other"):
        shardfuzz.run(TOY, settings=settings(max_examples=3), max_examples=3)


def test_dtypes_restrict_what_is_drawn():
    res = shardfuzz.run(TOY, profile="shardfuzz-ci", database=None, max_examples=15, dtypes=("float64",))
    assert not res.found and res.stats.triggers["float64"] == res.stats.examples == 15


@pytest.mark.parametrize(
    "dtypes", [("float32", "float64", "bfloat16", "float16"), ("float16", "float32"), ("float64", "bfloat16")]
)
def test_dtypes_are_spread_over_every_one_listed(dtypes):
    """A dtype the target never draws gets its share beside those it does: keeping every drawn
    dtype that was listed, a new user's run of float32,float64,bfloat16,float16 drew no float16."""
    t = get_target("tp_mlp")  # draws float32, float64 and bfloat16
    pool = pool_for(t, None, dtypes, ())
    drawn = collections.Counter(case.dtype for case, _ in pool)
    assert set(drawn) == set(dtypes), drawn
    assert min(drawn.values()) >= len(pool) / len(dtypes) / 2, drawn


class Count(RunHooks):
    def __init__(self):
        self.before, self.found, self.contexts = 0, [], []

    def before_example(self, runner, case):
        self.before += 1

    def on_finding(self, context, finding):
        self.contexts.append(context)
        self.found.append(finding.kind)


def test_hooks_are_declared_objects():
    hook = Count()
    r = Runner(TOY, "wrong_rank1", hooks=[hook])
    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 3}, split=("n",))
    with pytest.raises(Mismatch) as excinfo:
        r.run_case(case)
    assert hook.before == 1 and hook.found == ["mismatch"]
    # the hook gets the finding's frozen context, not the runner
    (context,) = hook.contexts
    assert context is excinfo.value.context and context.case == case and context.impl == "wrong_rank1"
    assert context.inputs_sha256 == inputs_hash(r.last_inputs) and context.traces == excinfo.value.traces
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.impl = "other"  # type: ignore[misc]
    with pytest.raises(InvalidArgument, match="hooks must be"):
        Runner(TOY, hooks=[print])


def test_a_deadline_stops_the_search():
    res = shardfuzz.run(TOY, profile="shardfuzz-ci", database=None, max_examples=10_000, deadline=2.0)
    assert res.out_of_time and not res.found and 0 < res.stats.examples < 10_000


def test_bound_implementation_and_the_device_mesh():
    """bind() passes arguments to the ranks; ctx.mesh.device_mesh() names the axis under test 'impl'."""
    r = Runner(TOY, "via_device_mesh")
    assert r.impl_ref.kwargs == (("use_device_mesh", True),)
    for world, mesh in ((2, (2,)), (4, (2, 2)), (2, (2, 1))):
        case = Case(target="toy", world_size=world, mesh=mesh, sizes={"n": 5}, split=("n",))
        assert r.run_case(case) < 1


def test_a_derived_targets_cases_drawn_with_the_base_name_are_refused_saying_which_name(tmp_path):
    """A new user derived a variant with cases of their own, drawn with sst.cases(BASE, ...): the
    first example said only "case.target='base' but this runner fuzzes 'variant'"."""
    base = get_target(TOY)
    variant = base.derive("toy_variant", cases=base.cases)  # the base's function: draws "toy" cases
    case = Case(target="toy", world_size=2, mesh=(2,), sizes={"n": 4}, split=("n",))
    with pytest.raises(
        InvalidArgument, match=r"a target's own cases= draws with its name, sst.cases\('toy_variant'"
    ):
        Runner(variant, "reference").run_case(case)


def test_derived_target_resolves_its_implementations_in_the_callers_module():
    t = get_target(f"{DERIVED}::my_tp")
    assert t.name == "my_tp" and not t.planted and not t.expected_failures
    assert set(t.implementations) == {
        "reference",
        "torch_tp_dtensor",
        "torch_sp_even",
        "torch_sp_dtensor",
        "mine",
    }
    assert t.impl_ref("mine").ref.endswith("derived_target.py::my_tp_mlp")
    assert t.impl_ref("reference").ref == "shardfuzz.targets.tp_mlp:reference"
    again = get_target(f"{DERIVED}::my_tp_broken")
    assert again.description == "mine" and again.impl_ref("mine") == t.impl_ref("mine")
    ok = shardfuzz.run(f"{DERIVED}::my_tp", "mine", profile="shardfuzz-ci", database=None, max_examples=10)
    assert not ok.found and ok.stats.passed == 10
    bad = shardfuzz.run(
        f"{DERIVED}::my_tp_broken", "broken", profile="shardfuzz-ci", database=None, max_examples=30
    )
    assert bad.found and bad.kind == "mismatch" and bad.case.world_size == 2


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(DATA)), "examples", "mean_target.py")


def test_tolerance_is_a_policy_or_per_output_overrides_on_the_default():
    from shardfuzz import OutputTolerance, Tolerance

    cfg = RunConfig(tolerance={"a": OutputTolerance(rtol=1e-3), "b": {"atol": 1e-5}, "c": (0.5, 1)})
    assert cfg.tolerance == Tolerance().with_overrides(
        {"a": OutputTolerance(1e-3, 0), "b": OutputTolerance(0, 1e-5), "c": OutputTolerance(0.5, 1.0)}
    )
    assert cfg.tolerance.noise_model == Tolerance().noise_model  # the default policy for the rest
    assert RunConfig.from_json(cfg.to_json()) == cfg  # how --jobs children get it
    policy = Tolerance(noise_model="dtype-rerun", per_output={"a": (0, 1)})
    assert RunConfig(tolerance=policy).tolerance is policy


@pytest.mark.parametrize(
    "value, message",
    [
        (3, "tolerance=3; must be a shardfuzz.Tolerance, or a mapping of output names"),
        ("y=rtol:1", "tolerance='y=rtol:1'; must be a shardfuzz.Tolerance"),
        ({"y": "x"}, "tolerance['y']='x'"),
        ({"y": {"rtl": 1}}, "tolerance['y']={'rtl': 1}"),
        ({"y": (-1, 0)}, "tolerance['y']=(-1, 0): rtol=-1; must be a finite number >= 0"),
        ({"y": (0, 1, 2)}, "tolerance['y']=(0, 1, 2)"),
        ({1: (0, 1)}, "its keys must be output names, got 1"),
    ],
)
def test_bad_tolerance_is_a_named_error(value, message):
    with pytest.raises(InvalidArgument) as e:
        RunConfig(tolerance=value)
    assert message in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        shardfuzz.run(TOY, tolerance=value)
    assert message in str(e.value)


def test_tolerance_must_name_an_output_of_the_target():
    with pytest.raises(InvalidArgument, match=r"tolerance names output 'totl', which target 'toy' does not"):
        shardfuzz.run(TOY, tolerance={"totl": (0, 1)})
    with pytest.raises(InvalidArgument, match="names output 'totl'"):
        shardfuzz.run(TOY, config=RunConfig(tolerance={"totl": (0, 1)}))
    # outputs that depend on the case: any name may be one of them, so none is refused
    from types import SimpleNamespace

    from shardfuzz.engine.config import check_tolerance_outputs
    from shardfuzz.spec.tolerance import Tolerance

    varying = SimpleNamespace(name="v", outputs=lambda case: {})
    check_tolerance_outputs([varying], Tolerance(per_output={"anything": (0, 1)}), "tolerance")


def test_run_applies_a_per_output_tolerance():
    """An absurdly tight fixed tolerance makes the correct reference "fail" in bf16; a loose one passes."""
    from shardfuzz import OutputTolerance

    kw = dict(profile="shardfuzz-ci", database=None, dtypes=("bfloat16",))
    tight = shardfuzz.run(EXAMPLE, max_examples=30, tolerance={"mean": OutputTolerance(rtol=0, atol=0)}, **kw)
    assert tight.found and tight.kind == "mismatch" and tight.case.dtype == "bfloat16", tight.report
    loose = shardfuzz.run(EXAMPLE, max_examples=10, tolerance={"mean": (1.0, 1.0)}, **kw)
    assert not loose.found and loose.stats.triggers["bfloat16"] == loose.stats.examples == 10


def test_a_per_output_tolerance_may_name_a_pattern_of_outputs_and_an_outputs_own_wins():
    """A new user's outputs per step (grad_w_0, grad_w_1, ...) took 18 --tolerance flags."""
    from shardfuzz.engine.config import check_tolerance_names

    tol = Tolerance(per_output={"grad_*": (1e-3, 0.0), "grad_x": (1.0, 0.0)})
    assert tol.for_output("grad_w_1") == OutputTolerance(1e-3, 0.0)
    assert tol.for_output("grad_x") == OutputTolerance(1.0, 0.0)  # its own, over the pattern
    assert tol.for_output("y") is None  # the noise model
    check_tolerance_names({"t": ["y", "grad_w_0", "grad_x"]}, tol, "--tolerance")  # each matches an output
    with pytest.raises(InvalidArgument, match=r"--tolerance names output 'loss_\*', which target 't'"):
        check_tolerance_names(
            {"t": ["y", "grad_w_0"]}, Tolerance(per_output={"loss_*": (0, 1)}), "--tolerance"
        )
    loose = shardfuzz.run(
        EXAMPLE,
        profile="shardfuzz-ci",
        database=None,
        max_examples=10,
        dtypes=("bfloat16",),
        tolerance={"m*": (0, 0)},
    )  # the pattern reaches the run's one output, "mean": as tight as the test above
    assert loose.found and "except output 'm*': " in loose.report, loose.report


def test_a_mismatch_under_a_per_output_tolerance_says_so():
    tight = shardfuzz.run(
        EXAMPLE, profile="shardfuzz-ci", database=None, max_examples=30, dtypes=("bfloat16",),
        tolerance={"mean": (0, 0)},
    )  # fmt: skip
    assert tight.found and "except output 'mean': " in tight.report, tight.report
    assert (
        "(fixed per-output tolerance)" in tight.report
        and "--tolerance mean=rtol:0.0,atol:0.0" in tight.report
    )


def test_every_environment_variable_the_engine_reads_is_in_the_one_table():
    import pathlib
    import re

    from shardfuzz.limits import ENV_INTS, ENVIRONMENT

    root = pathlib.Path(__file__).resolve().parent.parent
    read = {
        name
        for path in [
            *root.glob("shardfuzz/**/*.py"),
            *root.glob("strategies/*.py"),
            *root.glob("targets/*.py"),
        ]
        for name in re.findall(r"\bSHARDFUZZ_[A-Z_]*[A-Z]\b", path.read_text())
    }
    table = {v.name for v in ENVIRONMENT}
    assert read - table == set(), (
        f"read by the engine but not in shardfuzz.limits.ENVIRONMENT: {read - table}"
    )
    assert table - read == set(), f"in ENVIRONMENT but read nowhere: {table - read}"
    assert set(ENV_INTS) <= table
