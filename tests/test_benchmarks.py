"""benchmarks/suite_cpu.py: the CPU of a run, by kind of process and by OS thread name."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SUITE_CPU = Path(__file__).resolve().parent.parent / "benchmarks" / "suite_cpu.py"


@pytest.fixture(scope="module")
def suite_cpu():
    spec = importlib.util.spec_from_file_location("suite_cpu", SUITE_CPU)
    module = importlib.util.module_from_spec(spec)
    sys.modules["suite_cpu"] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("suite_cpu", None)


def test_each_process_kind_is_told_from_its_command_line_and_its_parents(suite_cpu):
    forkserver = "/v/bin/python -c from multiprocessing.forkserver import main; main(14, 16, ['torch'])"
    xdist = "/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"
    kinds = {
        suite_cpu.kind_of(xdist, "python -m pytest", False),
        suite_cpu.kind_of(forkserver, xdist, False),
        suite_cpu.kind_of(forkserver, forkserver, False),  # a rank: forked, with its server's command
        suite_cpu.kind_of("/v/bin/python -m shardfuzz.frontends.cli fuzz tp_mlp", xdist, False),
        suite_cpu.kind_of("/v/bin/python -m torch.distributed.run --nnodes 2", xdist, False),
        suite_cpu.kind_of("python -m pytest --hypothesis-profile=ci", "bash", True),
        suite_cpu.kind_of("/v/bin/python -mpytest --basetemp=/tmp/pytest-of-root/x", xdist, False),
        # a script under pytest's temporary folder is not pytest
        suite_cpu.kind_of("/v/bin/python /tmp/pytest-of-root/pytest-4/t0/wrapper.py /tmp/x", xdist, False),
    }
    assert kinds == {
        "pytest-xdist workers (the drivers: search, oracle, noise, judge)",
        "forkservers",
        "ranks (forkserver children)",
        "shardfuzz commands (subprocesses)",
        "torchrun and rank servers",
        "the command's own process (pytest's main one)",
        "pytest subprocesses",
        "other: python wrapper.py",
    }


def test_the_cpu_of_a_command_and_of_its_child_is_attributed_to_each(suite_cpu):
    """Real processes that burn known CPU time (not wall time, so a loaded machine changes
    nothing): the command 0.4 s, its child 0.6 s, each under its own kind."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n"
    command = [
        sys.executable,
        "-c",
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {burn.format(0.6)!r}])\n"
        + burn.format(0.4)
        + "child.wait()\n",
    ]
    code, _, sampler, (busy, _), _ = suite_cpu.run(command, 0.02)
    seconds = {kind: ticks / suite_cpu.TICK for kind, ticks in sampler.by_kind.items()}
    assert code == 0
    assert 0.3 <= seconds["the command's own process (pytest's main one)"] <= 0.7, seconds
    assert 0.45 <= seconds[f"other: {Path(sys.executable).name} -c"] <= 0.9, seconds
    assert sum(seconds.values()) <= busy / suite_cpu.TICK + 0.05  # never more than the machine's
    report = suite_cpu.report(code, 1.0, sampler, (busy, 0), "done", top=1)
    assert "the command's own process" in report and "python" in report
    # the costliest process, by its command line: the child
    assert report.split("the 1 processes that used the most CPU")[1].count("< 0.6") == 1, report


def test_a_process_first_seen_late_counts_the_cpu_it_used_before(suite_cpu):
    """A process that started between two samples has all its CPU counted at its first sample,
    not only what it uses after."""
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "print('burnt', flush=True)\nsys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline() == "burnt\n"
        sampler = suite_cpu.Sampler(child.pid)
        sampler.sample()
        assert sum(sampler.by_kind.values()) / suite_cpu.TICK >= 0.25, sampler.by_kind
    finally:
        child.communicate("")


def test_a_bad_interval_is_refused_naming_it(suite_cpu, capsys):
    with pytest.raises(SystemExit) as e:
        suite_cpu.main(["--interval", "0"])
    assert e.value.code == 2
    assert "--interval 0.0: must be above 0 seconds" in capsys.readouterr().err
