"""Helpers to prove that a fuzz target works: its planted bugs are found and shrink to a minimal
structure, and its reference passes. The built-in targets' tests use them; so can yours.

    from shardfuzz.frontends.testing import Expect, assert_planted_bug_found, assert_reference_passes

    def test_mean_of_means_is_found():
        assert_planted_bug_found("my_target.py", "mean_of_means", Expect(kind="mismatch", world_size=2, mesh=(2,), uneven=("rows",)), p95=20)

:func:`run_cli` runs the ``shardfuzz`` command in the calling process, for tests of a CLI workflow.

A built-in target declares the same facts once, as :class:`~shardfuzz.PlantedBug` records;
``tests/test_targets.py`` proves every registered target from them.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from typing import Any

from shardfuzz.case import Case
from shardfuzz.engine.search import Result, run
from shardfuzz.errors import Mismatch
from shardfuzz.frontends import cli
from shardfuzz.report.closest_pass import margin_text
from shardfuzz.spec.records import Expect, note_contradictions
from shardfuzz.spec.refs import anchored_ref, caller_dir
from shardfuzz.spec.registry import get_target
from shardfuzz.spec.triggers import is_effective, triggers_of

__all__ = ["Expect", "assert_planted_bug_found", "assert_reference_passes", "budget", "uneven_sizes"]


def uneven_sizes(case: Case) -> tuple[str, ...]:
    """The split sizes that the implementation's group size does not divide."""
    return tuple(n for n in case.split if case.sizes[n] % case.group_size)


def budget(p95: int) -> int:
    """The example budget for a planted-bug test: twice the 95th percentile of examples-to-failure
    over 20 seeds (``benchmarks/budget.py`` measures it), plus 10."""
    return 2 * p95 + 10


def assert_planted_bug_found(
    target: Any, impl: str, expect: Expect, *, p95: int, failures_dir: str | None = None
) -> Result:
    """Run the ``shardfuzz-ci`` settings (derandomized, database off) and check the finding. A
    relative ``file.py`` target is found next to the calling test file first. ``failures_dir``:
    where the finding's failure file goes (none by default), e.g. for a replay or a reproducer."""
    target = anchored_ref(target, caller_dir())
    result = run(
        target,
        impl,
        profile="shardfuzz-ci",
        database=None,
        max_examples=budget(p95),
        timeout=expect.timeout,
        exclude=expect.exclude,
        options=dict(expect.options),
        failures_dir=failures_dir,
    )
    name = f"{get_target(target).name}/{impl}"
    assert result.found, f"{name} not found in {budget(p95)} examples: {result.stats.summary()}"
    check_finding(result, expect, target, name)
    # the shrunk case's own margin (the run's smallest, over every failing example, is another
    # case's: a user compared it with `shardfuzz case` on the printed one and found 27.8x vs 2.1e6x)
    shrunk = next((f for f in result.failures if f.case == result.case and f.ratio is not None), None)
    if shrunk is not None and shrunk.kind == "mismatch" and shrunk.ratio is not None:
        print(f"{name}: {result.case!r}, margin {margin_text(shrunk.ratio)}")
    return result


def check_finding(result: Result, expect: Expect, target: Any, name: str) -> None:
    """What :func:`assert_planted_bug_found` asks of a search's finding (``result.found``): the
    kind, the shrunk case's world, mesh, uneven sizes, ``check``, note and ``needs``, and the wrong
    outputs; each failed check says which. ``name``: ``target/impl``, for the messages."""
    shrunk = f"{name} was found, but the shrunk case"
    assert result.kind in expect.kinds, (
        f"{shrunk} is a {result.kind!r} finding; Expect(kind=...) allows {sorted(expect.kinds)}\n{result.report}"
    )
    case = result.case
    assert case is not None, result.report  # set whenever something was found
    worlds = expect.world_size if isinstance(expect.world_size, tuple) else (expect.world_size,)
    mesh = expect.mesh if expect.mesh is not None else (case.world_size,)
    # mesh=None means the 1-D mesh of whatever world: said so (a new user read "mesh=(1,)" as a demand)
    meshes = f"mesh={expect.mesh}" if expect.mesh is not None else "a 1-D mesh (Expect(mesh=None))"
    assert case.world_size in worlds and case.mesh == mesh, (
        f"{shrunk} has world_size={case.world_size}, mesh={case.mesh}; Expect allows world_size in "
        f"{worlds}, {meshes}\n{result.report}"
    )
    if expect.uneven is not None:
        unsplit = [n for n in expect.uneven if n not in case.split]
        assert uneven_sizes(case) == tuple(expect.uneven), (
            f"{shrunk} has uneven sizes {uneven_sizes(case)}; Expect(uneven=...) is {tuple(expect.uneven)}"
            + (
                f" ({', '.join(map(repr, unsplit))}: not a size the case splits; it splits {case.split})"
                if unsplit
                else ""
            )
            # a Split(allow_empty=True) bug often shrinks to fewer rows than ranks, which is uneven
            + (
                f"; if the bug shows on these sizes too, say so: Expect(uneven={uneven_sizes(case)!r}), or "
                "uneven=None for any"
                if uneven_sizes(case) and not unsplit
                else ""
            )
            + f"\n{result.report}"
        )
    if expect.check is not None:
        assert expect.check(case), f"{shrunk} {case!r} fails Expect(check=...)\n{result.report}"
    contradicted = note_contradictions(expect.note, case)  # the note says what check asks: it holds
    assert not contradicted, (
        f"note {expect.note!r} says {contradicted}, which the shrunk case {case!r} does not bear out"
    )
    if expect.needs:
        t = get_target(target) if isinstance(target, str) else target
        options = {f"{k}={v!r}" for k, v in case.options.items()}
        reached = triggers_of(t, case) | {c for c in options if is_effective(t, c, case)}
        missing = sorted(set(expect.needs) - reached)
        assert not missing, f"the shrunk case does not reach {missing}:\n{result.report}"
    if expect.outputs is not None:
        first = result.failures[0]
        assert isinstance(first, Mismatch), result.report  # only mismatches name wrong outputs
        wrong = tuple(first.outputs)
        assert expect.allows_outputs(wrong), (
            f"{shrunk} has wrong outputs {wrong}, which Expect(outputs={expect.outputs!r}) does not allow"
            f"\n{result.report}"
        )


def assert_reference_passes(target: Any, dtype: str, *, examples: int = 500, impl: Any = None) -> Result:
    """``examples`` cases of the reference, all in ``dtype``, with no false positive. A relative
    ``file.py`` target or implementation is found next to the calling test file first."""
    here = caller_dir()
    t = get_target(anchored_ref(target, here))
    impl = anchored_ref(impl, here)
    result = run(t, impl, profile="shardfuzz-ci", database=None, max_examples=examples, dtypes=(dtype,))
    assert not result.found, result.report
    assert result.stats.passed == result.stats.examples >= examples, result.stats.summary()
    print(f"{t.name} {dtype}: worst passing error/tolerance {result.stats.closest_pass_words}")
    return result


def run_cli(
    *args: Any, cwd: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``shardfuzz ARGS`` in this process (:func:`shardfuzz.frontends.cli.main`), as a ``CompletedProcess``
    with its exit code and what it printed. A subprocess pays ``import torch`` twice (the command
    and its forkserver), about 5 s on 2 cores; here imports and pools are shared. ``env`` and
    ``cwd`` apply for the call only. Tests of signals, exit and import-time behaviour need a real
    process instead."""
    out, err = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in (env or {})}
    saved_cwd = os.getcwd()
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 2
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["shardfuzz", *map(str, args)], code, out.getvalue(), err.getvalue())
