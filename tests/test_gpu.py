"""GPU and NCCL. The CUDA tests skip cleanly without CUDA (CI has none); run them all with
``.ci/gpu-checks`` on a GPU machine. The placement rules are tested everywhere."""

import dataclasses
import json

import pytest
import torch

import shardfuzz
from shardfuzz import InfrastructureError, InvalidArgument, RunConfig
from shardfuzz.ranks.gpu import check_placement, placement_summary
from shardfuzz.spec.registry import get_target

N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
cuda = pytest.mark.gpu  # skipped without CUDA by tests/conftest.py


def test_placement_summary_says_what_can_run():
    text = placement_summary([get_target("tp_mlp"), get_target("vocab_parallel")], n_gpus=1)
    assert "1 CUDA device(s) visible" in text
    assert "nccl: every target, world sizes 1..1" in text
    assert "gloo on CUDA tensors (ranks may share a GPU): tp_mlp, vocab_parallel" in text
    assert "nothing (needs one CUDA device per rank)" in placement_summary([get_target("tp_mlp")], n_gpus=0)


def test_nccl_with_too_few_gpus_is_refused_clearly():
    if N_GPUS >= 2:
        pytest.skip("this machine has 2+ GPUs")
    with pytest.raises(
        InfrastructureError, match=r"needs one CUDA device per rank: world_size=2 but \d device"
    ):
        check_placement(get_target("tp_mlp"), "nccl", "cuda", 2)


def test_gloo_on_cuda_needs_a_target_limited_to_all_reduce_and_broadcast(monkeypatch):
    import shardfuzz.ranks.gpu as gpu

    monkeypatch.setattr(gpu, "cuda_device_count", lambda: 1)
    check_placement(get_target("tp_mlp"), "gloo", "cuda", 4)  # all_reduce only: fine on one GPU
    undeclared = dataclasses.replace(get_target("tp_mlp"), collectives=None)
    with pytest.raises(InvalidArgument, match="does not declare its collectives"):
        check_placement(undeclared, "gloo", "cuda", 2)
    with pytest.raises(InvalidArgument, match="device='cpu' with backend='nccl'"):
        RunConfig(backend="nccl", device="cpu")


@cuda
def test_nccl_reference_passes_and_planted_bug_is_found():
    ws = tuple(range(1, min(N_GPUS, 4) + 1))
    ok = shardfuzz.run(
        "tp_mlp", backend="nccl", world_sizes=ws, max_examples=40, database=None, profile="shardfuzz-ci"
    )
    assert not ok.found, ok.report
    assert ok.stats.passed == 40
    if N_GPUS >= 2:
        bad = shardfuzz.run(
            "tp_mlp",
            "missing_allreduce",
            backend="nccl",
            world_sizes=ws,
            max_examples=40,
            database=None,
            profile="shardfuzz-ci",
        )
        assert bad.found and bad.kind == "mismatch" and bad.case.world_size == 2


@cuda
@pytest.mark.parametrize("target", ["tp_mlp", "vocab_parallel"])
def test_gloo_on_cuda_tensors_several_ranks_on_one_gpu(target):
    ok = shardfuzz.run(target, device="cuda", max_examples=40, database=None, profile="shardfuzz-ci")
    assert not ok.found, ok.report


@cuda
def test_numerics_flags_and_deterministic_mode_are_recorded(tmp_path):
    res = shardfuzz.run(
        "tp_mlp",
        "missing_allreduce",
        device="cuda",
        deterministic=True,
        max_examples=30,
        database=None,
        profile="shardfuzz-ci",
        failures_dir=str(tmp_path),
    )
    assert res.found
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert rec["device"] == "cuda" and rec["deterministic"] is True
    assert rec["numerics"]["rank0"]["deterministic_algorithms"] is True
    assert "cudnn_allow_tf32" in rec["numerics"]["rank0"]


@cuda
def test_cpu_failure_replays_on_gpu(tmp_path):
    from shardfuzz.engine import failures
    from shardfuzz.repro.replay import replay_one

    res = shardfuzz.run(
        "tp_mlp",
        "missing_allreduce",
        max_examples=30,
        database=None,
        profile="shardfuzz-ci",
        failures_dir=str(tmp_path),
    )
    assert res.found
    rec = failures.load(str(next(tmp_path.glob("*.json"))))
    backend = "nccl" if N_GPUS >= rec["case"].world_size else "gloo"
    out = replay_one(rec, backend=backend, device="cuda")
    assert out.failed and out.status == "still fails"  # same inputs: built on CPU from the seed, then moved
