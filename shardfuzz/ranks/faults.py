"""Faults that are not the implementation's: a rank death from outside, and process state (the
environment, the working directory) that one example leaves to the next.

* :func:`confirm_death`: any rank death, whatever its exit code (SIGKILL from a user or the OOM
  killer, 255 when the forkserver that started the ranks was killed), is rerun once on fresh ranks
  before it is a finding. A death that does not recur is an external fault: counted in
  ``Stats.external_faults`` and shown in the summary, not a finding. A case whose death did not
  recur once and then died again dies only sometimes: it is reported (as flaky), not set aside.
  The one death not rerun is one where every dead rank aborted on gloo's uncaught size check
  (:data:`SELF_INFLICTED`), which ranks whose collectives differ in size cause themselves.
* :class:`ProcessState`: ``os.environ`` and ``os.getcwd()`` are snapshot around every example, in
  each rank and in the driver, and restored with the change named (a leak, like torch's global
  settings in :mod:`shardfuzz.ranks.task`): an implementation that sets ``os.environ[...]`` or changes
  directory cannot change the next example (a false finding that reproduces, since the pool is
  warm). The snapshot is a dict copy and a compare: a few microseconds per example.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import TYPE_CHECKING, Any

from shardfuzz.errors import ExternalFault, Finding

if TYPE_CHECKING:
    from shardfuzz.case import Case
    from shardfuzz.protocol import RankDied

FLAKY_DEATH_NOTE = (
    "\nThis case's rank death did not recur once when rerun on fresh ranks, and then recurred: "
    "it dies only sometimes (flaky), which is reported, not set aside as an external fault."
)


#: what libstdc++'s terminate handler writes to stderr, in the dying process, before it aborts on
#: gloo's uncaught ``EnforceNotMet``: gloo's check that a message fits the buffer posted for it,
#: which fails where the ranks' collectives differ in size (torch's sequence-parallel TP on an
#: uneven sequence). Only that exception: an NCCL watchdog's ``DistBackendError`` follows a peer
#: stalled from outside, and ``std::bad_alloc`` or ``std::system_error`` follow the machine's limits
SELF_INFLICTED = "terminate called after throwing an instance of 'gloo::EnforceNotMet'"


def _self_inflicted(outcome: RankDied) -> bool:
    """Whether every rank that died aborted (SIGABRT) after writing :data:`SELF_INFLICTED` at the
    start of a line of its own stderr in the example: a death no rerun can set aside. Every rank: a
    peer killed from outside can take a survivor down with it, and the lowest dead rank is the one
    reported. (A line cut out of a long output, or a rank server's, whose output a dead server
    cannot send, reads as not written: the death is rerun, as every death was.)"""
    dead = outcome.dead or {outcome.rank: outcome.exitcode}
    return all(code == -signal.SIGABRT and _wrote(outcome.output.get(r, ""), r) for r, code in dead.items())


def _wrote(output: str, rank: int) -> bool:
    """Whether ``output`` (:meth:`Pool._output`'s sections) has :data:`SELF_INFLICTED` starting a
    line of rank ``rank``'s stderr section."""
    section = re.search(
        rf"^--- rank {rank} stderr ---\n(.*?)(?=^--- rank {rank} \w+ ---$|\Z)", output, re.M | re.S
    )
    return section is not None and any(line.startswith(SELF_INFLICTED) for line in section[1].splitlines())


def confirm_death(
    runner: Any, case: Case, outcome: RankDied
) -> str:  # runner: the engine's Runner, a layer above
    """Rerun ``case`` once on fresh ranks after ``outcome``, unless the dead ranks aborted on their
    own (:func:`_self_inflicted`). Raises :class:`ExternalFault` when it passes (the first time
    for this case); returns a note for the report otherwise ("" when the death recurred on the
    rerun or was the rank's own, :data:`FLAKY_DEATH_NOTE` when it recurs only sometimes)."""
    if runner._confirming or _self_inflicted(outcome):
        return ""
    runner._confirming = True
    try:
        runner._run_on_pool(case)
    except Finding:
        return ""  # it dies (or fails) again: the implementation's own doing
    finally:
        runner._confirming = False
    key = repr(case)
    if key in runner.deaths_set_aside:
        return FLAKY_DEATH_NOTE
    runner.deaths_set_aside.add(key)
    runner.stats.external_faults += 1
    code = outcome.exitcode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"died (exit code {code})"
    raise ExternalFault(
        f"rank {outcome.rank} {how} from outside the example and {case!r} passed when rerun on fresh "
        "ranks: an external fault, not a finding"
    )


class ProcessState:
    """The environment and working directory of this process, to snapshot before an example and
    check (and restore) after it. ``who`` names the process in the leaks (``rank 1``, ``the
    driver``)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.raw: dict[Any, Any] = {}
        self.cwd = ""

    def snapshot(self) -> None:
        self.raw = _raw_environ().copy()
        self.cwd = _cwd()

    def restore(self) -> list[str]:
        """Put back what changed since :meth:`snapshot`; the leaks, named (empty: nothing changed)."""
        leaks: list[str] = []
        cwd = _cwd()
        if cwd != self.cwd:
            leaks.append(f"{self.who} left the working directory {cwd!r} (was {self.cwd!r})")
            try:
                os.chdir(self.cwd)
            except OSError as e:  # the old directory is gone: say so, the next example runs anyway
                leaks[-1] += f"; could not go back: {e.strerror}"
        if _raw_environ() == self.raw:
            return leaks
        before, now = _decoded(self.raw), os.environ.copy()
        for name in sorted(now.keys() | before.keys()):
            old, new = before.get(name), now.get(name)
            if old == new:
                continue
            if old is None and _torch_default(name, new):
                continue
            if old is None:
                leaks.append(f"{self.who} left os.environ[{name!r}] = {new!r} (was unset)")
                del os.environ[name]
            else:
                was = "unset" if new is None else f"= {new!r}"
                leaks.append(f"{self.who} left os.environ[{name!r}] {was} (was {old!r})")
                os.environ[name] = old
        return leaks


def _torch_default(name: str, value: str | None) -> bool:
    """``value`` is what torch itself sets ``name`` to when it first needs it, whoever ran first:
    inductor's ``cache_dir()`` writes its default ``TORCHINDUCTOR_CACHE_DIR`` into the environment
    (the ring-attention oracle reaches it). The next example would get the same value, so it is
    kept, and not named as a leak."""
    if name != "TORCHINDUCTOR_CACHE_DIR" or value is None:
        return False
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")  # imported when it set it
    return utils is not None and value == os.path.abspath(utils.default_cache_dir())


def _raw_environ() -> dict[Any, Any]:
    """os.environ's own dict of encoded names and values: copying and comparing it takes ~1 us,
    where the public mapping decodes every entry (~120 us for 35 variables, on every example)."""
    raw: dict[Any, Any] = os.environ._data  # type: ignore[attr-defined]
    return raw


def _decoded(raw: dict[Any, Any]) -> dict[str, str]:
    env = os.environ
    return {env.decodekey(k): env.decodevalue(v) for k, v in raw.items()}


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # the working directory was removed
        return ""
