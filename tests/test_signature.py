"""Finding signatures by cause (shardfuzz.signature): planted pairs in both directions, versions."""

import os
import pickle
import traceback

import pytest

from shardfuzz import Case, RankError, RunConfig, Runner
from shardfuzz.repro.replay import Replayed
from shardfuzz.signature import (
    SIGNATURE_VERSION,
    cause_of,
    finding_signature,
    normalise_message,
    raised_in_torch,
    signature_fields,
    stored_signature,
)

HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "data", "toy_target.py")
CAUSES = os.path.join(HERE, "data", "cause_impls.py")


def _innermost(tb: str) -> str:
    """Version 1's site: the innermost frame with its line (what merged different backward bugs)."""
    return [ln.strip() for ln in tb.splitlines() if ln.strip().startswith('File "')][-1]


def _rank_error(impl: str, case: Case) -> RankError:
    with pytest.raises(RankError) as e:
        Runner(TOY, f"{CAUSES}::{impl}", RunConfig(timeout=60)).run_case(case)
    return e.value


def _case(world: int, n: int, dtype: str = "float32") -> Case:
    return Case(target="toy", world_size=world, mesh=(world,), sizes={"n": n}, split=("n",), dtype=dtype)


def _traceback(tb: str) -> str:
    return tb.split("terminated with the following error:\n", 1)[1]


def test_two_backward_bugs_raising_from_one_autograd_frame_stay_two_findings():
    scale = _rank_error("backward_scale", _case(1, 3))
    shift = _rank_error("backward_shift", _case(1, 3))
    tb_scale, tb_shift = _traceback(scale.report), _traceback(shift.report)
    # the planted pair: both raise from torch's one autograd engine frame, called from one user line
    assert "torch/autograd/graph.py" in _innermost(tb_scale) and _innermost(tb_scale) == _innermost(tb_shift)
    assert scale.signature != shift.signature
    assert cause_of(tb_scale).frame == "cause_impls.py in _backward_through"  # past torch's frames
    assert "_ScaleBackward" in scale.signature and "_ShiftBackward" in shift.signature
    assert pickle.loads(pickle.dumps(scale)).signature == scale.signature


def test_one_bug_whose_message_varies_with_sizes_ops_and_ranks_is_one_finding():
    found = [_rank_error("flatten_too_far", c) for c in (_case(1, 3), _case(1, 2), _case(2, 8, "bfloat16"))]
    messages = {f.report.split("RuntimeError: ")[1].splitlines()[0] for f in found}
    assert len(messages) == 3  # the raw messages differ (sizes; view or reshape)
    assert len({f.signature for f in found}) == 1, [f.signature for f in found]
    assert found[0].signature.startswith(f"v{SIGNATURE_VERSION}:")


def _format(fn) -> str:
    try:
        fn()
    except (ValueError, RuntimeError):  # what the planted functions raise
        return traceback.format_exc()
    raise AssertionError("expected an exception")


def _op_rule_a():
    raise ValueError("aten.view.default: Shard(dim=0) on a size-1 dim of torch.Size([1, 4])")


def _op_rule_b():
    raise ValueError("aten.view.default: Shard(dim=0) on a size-1 dim of torch.Size([1, 4])")


def _dispatch(rule):
    """A framework frame (under torch/distributed/tensor/_dispatch.py in a real traceback) that
    wraps what the op's rule raised, as DTensor's sharding propagation does."""
    try:
        rule()
    except ValueError as e:
        raise RuntimeError(f"Sharding propagation failed for {e}") from e


def test_a_wrapped_exception_is_keyed_by_the_frame_of_its_root_cause():
    a, b = _format(lambda: _dispatch(_op_rule_a)), _format(lambda: _dispatch(_op_rule_b))
    assert cause_of(a).frame == "test_signature.py in _op_rule_a"
    assert cause_of(b).frame == "test_signature.py in _op_rule_b"
    assert cause_of(a).exc_type == "RuntimeError" and cause_of(a).message == cause_of(b).message


def test_framework_frames_are_skipped_shardfuzz_torch_and_stdlib():
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/shardfuzz/ranks/worker.py", line 50, in run_example\n'
        '  File "/home/u/impl.py", line 12, in tp_forward\n'
        '  File "/x/site-packages/torch/distributed/tensor/_ops/_view_ops.py", line 400, in view_groups\n'
        '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2800, in all_reduce\n'
        '  File "/x/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper\n'
        "RuntimeError: aten.view.default: bad\n"
    )
    # the op's own rule (torch/distributed/tensor/_ops) is not framework: the deepest op frame wins
    assert cause_of(tb).frame == "torch/distributed/tensor/_ops/_view_ops.py in view_groups"


def test_a_rank_error_raised_inside_torchs_sharded_code_says_so(proof):
    """A new user's parallelize_module plan failed in DTensor's own code on 1 rank, and the report's
    one-rank note sent them to their own math: it now says where in torch it was raised. A user's
    own error, or one autograd re-raises from a backward, says nothing of torch."""
    import glob
    import json

    (found,) = glob.glob(str(proof("tp_mlp", "torch_tp") / "*.json"))
    report = json.loads(open(found).read())["report"]
    assert "raised inside torch (torch/distributed/tensor/" in report, report
    assert "docs/how-to/fuzz-pytorch.md lists the known ones" in report
    for impl in ("backward_scale", "flatten_too_far"):
        assert "raised inside torch" not in _rank_error(impl, _case(1, 3)).report
    tb = 'Traceback (most recent call last):\n  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 9, in all_reduce\nRuntimeError: x\n'
    assert raised_in_torch(tb) is None


def test_an_op_that_dtensors_dispatch_ran_on_a_local_shard_is_raised_inside_torch_too():
    """A new user's RowwiseParallel embedding on a rank with no vocabulary rows raised in
    torch/_ops.py, called from DTensor's dispatch: the last frame alone was not torch's sharded code,
    and the report sent them to their own math. The innermost torch frames are read; the user's own
    frame in between, or torch code that is no sharded code, still says nothing."""
    site = "/x/site-packages/torch"
    frames = [
        '  File "/home/u/sp_block.py", line 94, in forward',
        f'  File "{site}/nn/modules/module.py", line 1789, in _call_impl',
        f'  File "{site}/nn/functional.py", line 2615, in embedding',
        f'  File "{site}/distributed/tensor/_dispatch.py", line 440, in _dispatch_get_local_results_slow_path',
        f'  File "{site}/_ops.py", line 875, in __call__',
    ]
    error = "RuntimeError: index_select(): self indexing axis dim should be positive\n"
    tb = "Traceback (most recent call last):\n" + "\n".join(frames) + "\n" + error
    assert (
        raised_in_torch(tb)
        == "torch/distributed/tensor/_dispatch.py in _dispatch_get_local_results_slow_path"
    )
    user_between = [*frames[:4], '  File "/home/u/sp_block.py", line 20, in helper', frames[4]]
    assert (
        raised_in_torch("Traceback (most recent call last):\n" + "\n".join(user_between) + "\n" + error)
        is None
    )
    plain = [frames[0], frames[2], frames[4]]  # torch, but no sharded code of it
    assert raised_in_torch("Traceback (most recent call last):\n" + "\n".join(plain) + "\n" + error) is None


def test_a_users_folder_named_shardfuzz_is_not_shardfuzzs_own_code():
    """``git clone`` puts the repository in a folder named shardfuzz: every file under it was
    taken for shardfuzz's own machinery, and a user's frame was skipped when a finding was named
    (two of the suite's own tests failed in such a checkout)."""
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/shardfuzz/shardfuzz/ranks/worker.py", line 50, in run_example\n'
        '  File "/home/u/shardfuzz/tests/data/impls.py", line 12, in _backward_through\n'
        '  File "/x/site-packages/torch/autograd/graph.py", line 800, in _engine_run_backward\n'
        "ValueError: boom\n"
    )
    assert cause_of(tb).frame == "impls.py in _backward_through"


@pytest.mark.parametrize(
    "a,b",
    [
        (
            "Sharding propagation failed for Op(op=aten.view.default, args_schema=Spec(f32[1, 4](S(0))), [4])",
            "Sharding propagation failed for Op(op=aten.reshape.default, args_schema=Spec(bf16[1, 6, 2](S(0)R)), [12])",
        ),
        (
            "expected dtype torch.float32 but got torch.bfloat16 for a tensor of shape (3, 4) on 2 ranks",
            "expected dtype torch.float64 but got torch.float16 for a tensor of shape (5, 1, 2) on 4 ranks",
        ),
        ("placements (Shard(dim=0), Replicate()) at 0x7f3a", "placements (Partial(sum),) at 0x55aa"),
    ],
)
def test_messages_normalise_alike(a, b):
    assert normalise_message(a) == normalise_message(b), (normalise_message(a), normalise_message(b))


def test_different_bug_names_in_messages_stay_apart():
    assert normalise_message("Function MmBackward0 returned an invalid gradient") != normalise_message(
        "Function AddmmBackward0 returned an invalid gradient"
    )


def test_a_stored_finding_under_version_1_is_rekeyed_on_read_or_shown_stale():
    err = _rank_error("backward_scale", _case(1, 3))
    current = {"kind": err.kind, "report": err.report, **signature_fields(err)}
    assert (
        stored_signature(current).signature == finding_signature(err)
        and not stored_signature(current).rekeyed
    )
    old = {"kind": err.kind, "report": err.report, "format": "shardfuzz-failure", "version": 1}
    rekeyed = stored_signature(old)  # no signature fields: written before version 2
    assert rekeyed.signature == finding_signature(err) and rekeyed.rekeyed and rekeyed.stored_version == 1
    assert "re-keyed from signature version 1" in rekeyed.describe()
    record = {**old, "case": err.case, "target": "toy", "impl": "backward_scale"}
    assert (
        ", same cause"
        in Replayed("f.json", record, "still fails", True, err.kind, "", "", err.signature).line()
    )
    other = Replayed("f.json", record, "still fails", True, err.kind, "", "", "v2:[]").line()
    assert "A DIFFERENT CAUSE" in other
    mismatch = {"kind": "mismatch", "report": "shardfuzz: 1 of 4 outputs mismatch the oracle"}
    stale = stored_signature(mismatch)  # its site is not in the report: shown as such, not compared
    assert stale.stale and "not re-keyed" in stale.describe()
    mismatch_v2 = {**mismatch, "site": [["x2", [1]]], "signature_version": 1}
    assert stored_signature(mismatch_v2).signature == 'v2:["mismatch",["x2",[1]]]'
