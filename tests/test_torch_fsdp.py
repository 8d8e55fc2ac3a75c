"""PyTorch's FSDP2 (real PyTorch code) as implementations of zero_adamw_torch.

Its expected failure (the crash on a parameter with no elements) is a record of the target, proved
found and shrunk by tests/test_targets.py. Here: fully_shard with AdamW, clipping and no-sync
gradient accumulation passes in float32 and bfloat16 with the conditions that matter reached, HSDP
on 2 x 2 too, what they refuse is counted, and the per-parameter Shard(0) layout is read from the
returned DTensors (the same pieces as plain tensors are a layout finding).
"""

import pytest

import shardfuzz
from shardfuzz.spec.registry import get_target
from shardfuzz.spec.triggers import triggers_of
from shardfuzz.targets.zero_adamw import param_sizes


class Cases(shardfuzz.RunHooks):
    """Every case a run draws (before the implementation accepts or refuses it)."""

    def __init__(self):
        self.cases = []

    def before_example(self, runner, case):
        self.cases.append(case)


def _run(impl, dtype, examples, **kw):
    seen = Cases()
    result = shardfuzz.run(
        "zero_adamw_torch",
        impl,
        profile="shardfuzz-ci",
        database=None,
        max_examples=examples,
        dtypes=(dtype,),
        hooks=[seen],
        **kw,
    )
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= examples, result.stats.summary()
    return result, seen.cases


def _reached(cases, *triggers):
    """Each trigger is reached by some case that ran (the refused ones do not count)."""
    target = get_target("zero_adamw_torch")
    reached = set().union(*(triggers_of(target, c) for c in cases))
    missing = [t for t in triggers if t not in reached]
    assert not missing, missing


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fsdp2_passes_with_accumulation_clipping_and_uneven_shards(dtype):
    result, cases = _run("fsdp2", dtype, 40)
    ran = [c for c in cases if not c.options["empty_param"]]
    _reached(
        ran, "steps>=2", "steps>=2 with accumulation", "clip active", "uneven", "empty shard", "world>=3"
    )
    # a parameter with no elements crashes FSDP2 (the expected failure fsdp2_empty_param): refused
    assert result.stats.unsupported["empty parameter"] > 0, result.stats.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hsdp_passes_on_a_group_of_four(dtype):
    result, cases = _run("fsdp2_hsdp", dtype, 40, world_sizes=(4,))
    ran = [c for c in cases if c.group_size == 4 and not c.options["empty_param"]]
    assert len(ran) >= 40
    assert result.stats.unsupported["HSDP needs a group of 4"] > 0, result.stats.summary()
    # the shard axis has 2 ranks: an odd parameter is uneven there, a parameter of 1 leaves one empty
    assert any(s % 2 for c in ran for s in param_sizes(c))
    assert any(1 in param_sizes(c) for c in ran)
    _reached(ran, "steps>=2 with accumulation", "clip active")


def test_the_state_layout_is_read_from_the_dtensors():
    result = shardfuzz.run(
        "zero_adamw_torch",
        "tests/data/fsdp2_locals.py::fsdp2_local_pieces",
        profile="shardfuzz-ci",
        database=None,
        max_examples=10,
        world_sizes=(1, 2),
    )
    assert result.found and result.kind == "layout", result.report
    assert result.case.world_size == 2, result.report
