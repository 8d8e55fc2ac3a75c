"""The shardfuzz command: exit codes 0 / 1 / 2 / 3 and its output."""

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "mean_target.py")


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "shardfuzz.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_list_shows_targets_and_implementations():
    out = cli("list")
    assert out.returncode == 0, out.stderr
    assert "tp_mlp:" in out.stdout and "vocab_parallel:" in out.stdout
    assert "missing_allreduce" in out.stdout and "planted bug" in out.stdout


def test_fuzz_clean_target_exits_0_with_a_summary():
    out = cli("fuzz", EXAMPLE, "--max-examples", "20")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "row_mean" in out.stdout and "reference" in out.stdout and "20 examples" in out.stdout


def test_fuzz_finding_exits_1_and_prints_the_report_and_rerun_line():
    out = cli("fuzz", EXAMPLE, "--impl", "mean_of_means", "--max-examples", "100")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "mismatched elements" in out.stdout
    # no --failures-dir: the file goes to $SHARDFUZZ_FAILURES_DIR (the tests set it to a tmp dir)
    written = pathlib.Path(os.environ["SHARDFUZZ_FAILURES_DIR"]) / "row_mean-mean_of_means-gloo-mismatch.json"
    assert f"failure file: {written}" in out.stdout and written.exists()
    rerun = next(line for line in out.stdout.splitlines() if line.startswith("Rerun this case: "))
    # the rerun line reproduces exactly that case
    import shlex

    again = cli(*shlex.split(rerun.removeprefix("Rerun this case: shardfuzz ")))
    assert again.returncode == 1 and "FAIL (mismatch)" in again.stdout


def test_case_that_passes_exits_0():
    case = "Case(target='row_mean', world_size=3, mesh=(3,), sizes={'rows': 4, 'cols': 2}, split=('rows',))"
    out = cli("case", EXAMPLE, case)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("PASS")


def test_impl_by_reference_from_the_cli():
    out = cli("fuzz", EXAMPLE, "--impl", f"{EXAMPLE}::mean_of_means", "--max-examples", "30")
    assert out.returncode == 1 and "mismatch" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["fuzz", "nope"], "target='nope' is unknown; known targets:"),
        (["fuzz", "tp_mlp", "--impl", "nope"], "impl='nope' is not an implementation of target 'tp_mlp'"),
        (["fuzz", "tp_mlp", "--max-examples", "0"], "'0' is not an integer >= 1"),
        (["fuzz", "tp_mlp", "--world-sizes", "two"], "--world-sizes='two'"),
        (["fuzz", "tp_mlp", "--backend", "mpi"], "invalid choice: 'mpi'"),
        (["case", "tp_mlp", "Case(target='tp_mlp', world_size=2, mesh=(3,))"], "mesh=(3,) has 3 ranks"),
        (["fuzz", "missing_file.py"], "missing_file.py' does not exist"),
    ],
)
def test_usage_errors_exit_2_and_name_the_argument(args, message):
    out = cli(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr


def test_infrastructure_failure_exits_3():
    # nccl needs one GPU per rank; this machine (and CI) has fewer than 2
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ GPUs, so nccl at world size 2 would start")
    out = cli("fuzz", "tp_mlp", "--backend", "nccl", "--world-sizes", "2", "--max-examples", "2")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "the fuzzer itself failed" in out.stderr and "one CUDA device per rank" in out.stderr
