"""Stage ``ranks`` (layer 2 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

The only package that forks: spawning rank processes, the warm pools and their cache, regrouping
after a rank's exception, the worker loop, the task run on a rank, the collective trace and what
the GPUs can run. Imports the core and spec.

- ``faults.py``: `confirm_death()` (a rank death is rerun once on fresh ranks: one that does not
  recur is an external fault, not a finding) and `ProcessState` (the environment and working
  directory restored after every example)
- ``fast_exit.py``: exits without the interpreter's teardown of torch (the command, the
  forkserver): 1.2-1.7 s each.
- ``gpu.py``: what can run on the GPUs of this machine.
- ``parent_death.py``: die with the parent, however it dies (``PR_SET_PDEATHSIG``): the ranks,
  the rank servers, the ``--jobs`` workers.
- ``pool.py``: a warm forkserver pool of ranks, on the driver side: start, submit a task,
  collect one outcome.
- ``pool_cache.py``: the driver's pools per (backend, world size, device), least recently used
  stopped, and a warm spare started in the background for a pool discarded after a failure.
  (0.1: ``shardfuzz.pools``)
- ``remote.py``: rank servers that torchrun started, as the driver's pools (``--ranks``): the
  world waited for, a case on its first ranks, the world rebuilt after a death or a hang.
- ``regroup.py``: after a rank's own exception, rebuilds the pool's process group in place
  (`Regroup`) instead of discarding the pool. (0.1: ``shardfuzz.recover``)
- ``secret.py``: the shared secret of a driver and its rank servers, proved both ways by
  challenge and response (HMAC-SHA256), never sent.
- ``serve.py``: a rank server: one rank of a torchrun world serving a driver's tasks
  (``python -m shardfuzz.ranks.serve --driver HOST:PORT``).
- ``spawn.py``: starting ranks (the forkserver with torch and its lazy imports preloaded, the
  driver's TCPStore, no `__main__` re-import) and watching their CPU time (`ProgressWatch`).
- ``task.py``: `RankContext`, `Mesh` and `run_task()`: one task inside a rank. (0.1:
  ``shardfuzz.rank``)
- ``trace.py``: the collective trace of a rank: wrappers on the c10d and functional collectives
  that record each one entered (op, group, shapes, dtype, splits, peer), in memory and line by
  line in the rank's trace file (D38). (0.1: ``shardfuzz.collectives``)
- ``worker.py``: the life of a rank process: start, serve, watchdog, leave and rejoin the world
  group on a regroup.
"""
