"""``Target(oracle="self")``: the implementation at world size 1 in float64 is the oracle. A bug
that needs world size > 1 is found and shrunk; one that is there at world size 1 too passes, by
design, while a written oracle catches it; the oracle's inputs are the case's rounded ones; what
a self-oracle cannot do is refused by name. (The example's reference and planted bug are proved
by ``tests/test_examples.py``.)"""

import dataclasses
import os

import pytest
import torch

import shardfuzz
from shardfuzz import Case, Runner, TargetError, Unsupported
from shardfuzz.engine.degenerate import degenerate
from shardfuzz.frontends.testing import Expect, assert_planted_bug_found, check_finding
from shardfuzz.verdict.oracle import estimate_noise, evaluate_oracle

DATA = os.path.join(os.path.dirname(__file__), "data", "self_oracle.py")
SELF, WRITTEN, TP_SELF = (
    f"{DATA}::{n}" for n in ("row_parallel_self_bugs", "row_parallel_written", "tp_mlp_self")
)


def _case(target, dtype="bfloat16", **sizes):
    return Case(
        target=target,
        world_size=2,
        mesh=(2,),
        sizes={"batch": 2, "inner": 3, "out": 2, **sizes},
        split=("inner",),
        dtype=dtype,
        seed=5,
    )


@pytest.fixture(scope="module")
def w_offset_zero():
    """The proof of the self-oracle's planted bug, searched once for this module's tests."""
    return assert_planted_bug_found(
        SELF, "w_offset_zero", Expect(kind="mismatch", world_size=2, mesh=(2,)), p95=5
    )


def test_a_bug_that_needs_two_ranks_is_found_and_shrunk(w_offset_zero):
    result = w_offset_zero
    assert result.case is not None and result.case.sizes["inner"] == 2, result.report  # one column each
    assert "oracle: the implementation itself at world size 1" in result.report
    # Expect(outputs=...) in any order (what assert_planted_bug_found asks of the shrunk case): a
    # user who copied the summary's order (by name) was refused the same names
    wrong = tuple(result.failures[0].outputs)
    assert len(wrong) >= 2, wrong
    again = Expect(kind="mismatch", world_size=2, outputs=tuple(reversed(wrong)))  # mesh: 1-D by default
    assert again.allows_outputs(wrong) and again.mesh is None
    assert not again.allows_outputs(wrong[:1]) and not again.allows_outputs((*wrong, "extra"))
    with pytest.raises(TargetError, match=r"expected a tuple of distinct output names"):
        Expect(kind="mismatch", world_size=2, outputs=("y", "y"))  # a set would take it for ("y",)


def test_an_expect_the_shrunk_case_does_not_bear_out_says_which_check_failed(w_offset_zero):
    """A new user's ``Expect(world_size=...)`` that the shrunk case missed got only the report
    (the checks of assert_planted_bug_found, on its search's finding)."""
    name = "row_parallel_self_bugs/w_offset_zero"
    with pytest.raises(AssertionError) as e:
        check_finding(w_offset_zero, Expect(kind="mismatch", world_size=3, mesh=None), SELF, name)
    first = str(e.value).splitlines()[0]
    # mesh=None is said as what it means (the case's own mesh read as a demand for mesh=(2,))
    assert first.endswith(
        "has world_size=2, mesh=(2,); Expect allows world_size in (3,), a 1-D mesh (Expect(mesh=None))"
    ), first
    assert f"{name} was found, but the shrunk case" in first, first
    # Expect(uneven=...) naming a size the case does not split says so
    with pytest.raises(AssertionError) as e:
        check_finding(w_offset_zero, Expect(kind="mismatch", world_size=2, uneven=("out",)), SELF, name)
    first = str(e.value).splitlines()[0]
    assert first.endswith("is ('out',) ('out': not a size the case splits; it splits ('inner',))"), first


def test_a_bug_at_world_size_1_too_passes_a_self_oracle_and_fails_a_written_one():
    hidden = shardfuzz.run(SELF, "bias_twice", profile="shardfuzz-ci", database=None, max_examples=40)
    assert not hidden.found and hidden.stats.passed >= 40, hidden.report  # by design
    seen = shardfuzz.run(WRITTEN, "bias_twice", profile="shardfuzz-ci", database=None, max_examples=40)
    assert seen.found and seen.kind == "mismatch", seen.stats.summary()
    assert "oracle: the implementation itself" not in seen.report


def test_a_builtin_target_with_a_self_oracle_finds_its_planted_bug():
    t = shardfuzz.get_target(TP_SELF)
    bug = t.planted["bias_before_allreduce"]
    assert t.oracle == "self" and t.reference == "reference"
    assert_planted_bug_found(TP_SELF, bug.name, bug.expect, p95=bug.p95)


def test_the_oracle_is_the_implementation_in_float64_on_the_rounded_inputs():
    runner = Runner(SELF)
    case = _case("row_parallel_self_bugs")
    expected = runner.expected(case)
    assert expected.ref == {} and expected.source is not None  # the values come once the ranks answered
    expected.source.values(expected)
    written = evaluate_oracle(shardfuzz.get_target(WRITTEN), _case("row_parallel_written"))
    for name, ref in expected.ref.items():
        assert ref.dtype == torch.float64 and expected.low[name].dtype == torch.bfloat16, name
        # float64 inputs built afresh would differ from the bf16-rounded ones by ~1e-3
        torch.testing.assert_close(ref, written.ref[name], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            expected.low[name].double(), written.low[name].double(), rtol=0.05, atol=0.05
        )
    assert runner.run_case(case) <= 1.0


def test_a_case_the_implementation_alone_overflows_in_its_dtype_is_not_judged():
    """A float16 case at scale 3e4: ``y`` overflows at world size 1 too, where float64 does not.
    It is rejected and counted (as for a written oracle), never a mismatch: the sharded code does
    what the unsharded code does (a new user's false positive)."""
    case = dataclasses.replace(
        _case("row_parallel_self_bugs", dtype="float16", inner=8), profile="large", options={"scale": 30000.0}
    )
    with pytest.raises(Unsupported, match="overflows float16 where its float64 value is finite") as e:
        Runner(SELF).run_case(case)
    assert e.value.reason == "the oracle overflows the case dtype"
    smaller = dataclasses.replace(case, options={"scale": 30.0})  # within range: judged, and passes
    assert Runner(SELF).run_case(smaller) <= 1.0


def test_its_noise_is_drawn_on_the_rank():
    runner = Runner(SELF)
    case = _case("row_parallel_self_bugs", dtype="float32")
    expected = runner.expected(case)
    expected.source.values(expected)
    estimate_noise(runner.target, case, expected, 3)
    assert set(expected.noise) == {"y", "grad_x", "grad_w", "grad_b"}
    assert float(expected.noise["y"].max()) > 0  # a matmul and an add round
    assert float(expected.noise["y"].max()) < 1e-5 * float(expected.ref["y"].abs().max() + 1)


def test_an_oracle_that_is_neither_callable_nor_self_is_refused():
    t = shardfuzz.get_target(SELF)
    with pytest.raises(TargetError, match=r"oracle='selff' must be a callable or 'self'"):
        t.derive("bad", oracle="selff")


def test_what_needs_an_oracle_function_refuses_a_self_oracle():
    t = shardfuzz.get_target(SELF)
    case = _case("row_parallel_self_bugs")
    with pytest.raises(TargetError, match=r"has oracle='self'"):
        evaluate_oracle(t, case)
    with pytest.raises(TargetError, match=r"has oracle='self'"):
        degenerate(t, case)
    from shardfuzz.engine.selforacle import refuse

    with pytest.raises(
        TargetError, match=r"shardfuzz repro: target 'row_parallel_self_bugs' has oracle='self'"
    ):
        refuse(t, "shardfuzz repro")


def test_an_implementation_that_fails_at_world_size_1_is_a_usage_error_with_its_traceback():
    runner = Runner(SELF, "needs_two_ranks")
    with pytest.raises(
        TargetError,
        match=r"(?s)at world size 1 \(values\), the self-oracle of .*raised:.*needs at least two ranks",
    ):
        runner.run_case(_case("row_parallel_self_bugs"))


def test_what_the_noise_model_refuses_in_a_self_oracle_is_said_as_the_implementations_to_change():
    """Found in review: a hand-written softmax whose max gradients flow through, in a self-oracle's
    implementation, was reported as the rank's traceback through shardfuzz's own frames, saying to
    change "the oracle", then that a self-oracle needs an implementation that runs on one rank."""
    case = _case("row_parallel_self_bugs", dtype="float32")
    runner = Runner(SELF, "softmax_live_max")
    expected = runner.expected(case)
    expected.source.values(expected)
    with pytest.raises(TargetError) as refused:  # its noise samples, which a verdict near 1 draws
        estimate_noise(runner.target, case, expected, 3)
    said = str(refused.value)
    assert "(oracle='self'): the noise model refuses implementation" in said, said
    assert "softmax_live_max (at " in said and "self_oracle.py:" in said, said  # its own line
    assert "Detach the max" in said and "the oracle is that implementation: the change goes there" in said
    assert "Traceback" not in said and "needs an implementation that runs on one rank" not in said, said


def test_the_line_a_refusal_names_is_the_implementations_even_beside_shardfuzz_or_torch():
    """Found by review: the frame filter matched path prefixes without a separator, so a project
    at .../shardfuzz_contrib or a package torchvision was skipped, and the built-in targets (in
    shardfuzz/targets once installed from a wheel) too."""
    from shardfuzz.engine import selforacle

    package = os.path.dirname(os.path.dirname(os.path.abspath(selforacle.__file__)))
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))

    def raised_in(path):  # an exception whose innermost frame is line 2 of ``path``
        space = {}
        exec(compile("def f():\n    raise ValueError('x')\n", path, "exec"), space)
        try:
            space["f"]()
        except ValueError as e:
            return e

    for user in (package + "_contrib/impl.py", torch_dir + "vision/ops.py", package + "/targets/mine.py"):
        assert selforacle._user_frame(raised_in(user)) == f"{user}:2", user
    for ours in (package + "/verdict/noise.py", torch_dir + "/nn/functional.py"):  # skipped: this file's call
        assert selforacle._user_frame(raised_in(ours)).startswith(__file__ + ":"), ours


def test_a_target_error_of_the_implementations_own_is_still_its_traceback():
    """Found by review: the catch of the noise model's refusals caught every TargetError, so one the
    implementation's own code raised (only in the noise runs) read as a refusal, without its traceback."""
    case = _case("row_parallel_self_bugs", dtype="float32")
    runner = Runner(SELF, "target_error_under_a_mode")
    expected = runner.expected(case)
    expected.source.values(expected)
    with pytest.raises(
        TargetError, match=r"(?s)\(noise\), the self-oracle of .*raised:.*Traceback.*no_such_target"
    ):
        estimate_noise(runner.target, case, expected, 3)


def test_the_noise_model_leaves_collectives_alone():
    from shardfuzz.verdict.noise import _kind

    # at one rank a collective moves nothing, and an async one writes its result after it returns
    assert _kind(torch.ops.c10d.allreduce_.default).skip
    assert _kind(torch.ops._c10d_functional.all_reduce.default).skip
    assert not _kind(torch.ops.aten.add.Tensor).skip


def test_dtensor_code_is_refused_by_the_noise_model_and_runs_under_dtype_rerun():
    case = Case(
        target="tp_mlp_self",
        world_size=2,
        mesh=(2,),
        sizes={"batch": 1, "seq": 2, "d_model": 2, "hidden": 2, "d_out": 2},
        split=("hidden",),
        seed=3,
    )
    runner = Runner(TP_SELF, "torch_tp_dtensor")
    expected = runner.expected(case)
    expected.source.values(expected)  # the values are fine: only the noise mode cannot see inside
    with pytest.raises(TargetError, match=r"computes on \['DTensor'\], whose ops the noise model cannot"):
        estimate_noise(runner.target, case, expected, 3)
    rerun = Runner(
        TP_SELF,
        "torch_tp_dtensor",
        shardfuzz.RunConfig(tolerance=shardfuzz.Tolerance(noise_model="dtype-rerun")),
    )
    assert rerun.run_case(case) <= 1.0


def test_an_expect_of_even_sizes_on_an_uneven_shrunk_case_says_what_to_write(w_offset_zero):
    """A new user's row-parallel target drew Split(allow_empty=True): the bug shrank to one row on
    two ranks (uneven), and Expect's default uneven=() failed the proof with no word of the fix."""
    from shardfuzz.frontends.testing import uneven_sizes

    name = "row_parallel_self_bugs/w_offset_zero"
    case = w_offset_zero.case
    odd = dataclasses.replace(case, sizes={**case.sizes, "inner": 1})  # one row on two ranks
    assert uneven_sizes(odd) == ("inner",), odd
    with pytest.raises(AssertionError) as e:
        check_finding(
            dataclasses.replace(w_offset_zero, case=odd), Expect(kind="mismatch", world_size=2), SELF, name
        )
    first = str(e.value).splitlines()[0]
    assert first.endswith("say so: Expect(uneven=('inner',)), or uneven=None for any"), first
