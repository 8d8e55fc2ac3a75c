"""Stage ``engine`` (layer 5 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

Running cases: the Hypothesis glue, the runner, the self-oracle, the run configuration, settings
profiles, the example database, covering rows, hooks, statistics, and the failure files: written
on every finding, read back whole against their schema and the trust rule before anything they
name is imported. Imports every stage below it.

- ``config.py``: `RunConfig`, validated once: backend, device, world sizes, timeout, tolerance,
  dtypes, profile, budget, deadline, failures dir, determinism.
- ``covering.py``: covering rows (a pairwise covering array over the trigger conditions, drawn
  from the target's own strategy), run as plain cases before Hypothesis; a failing row is handed
  to Hypothesis through the database and shrunk.
- ``database.py``: the Hypothesis database, keyed per target, implementation and backend.
- ``degenerate.py``: inputs that hide bugs: the share of a target's cases with an output all
  zero or constant, or a one-hot softmax.
- ``failure_load.py``: reading a failure record in a safe order: schema, moved files, trust,
  then the target, the implementation's arguments and the case (its input size first).
- ``failure_schema.py``: the failure file's schema and version (`validate_failure_record`,
  `load_failure_file`), checked whole before anything is imported; escaping of untrusted
  strings.
- ``failures.py``: failure files (write, load).
- ``filewriter.py``: `FileWriter`, the write path of failure files beside other writers and on a
  full disk; the failures folder (`default_dir`, `check_failures_dir`), light enough for the
  pytest plugin's start.
- ``finding.py``: `FindingContext`, the frozen context of one finding (case, implementation,
  config, inputs digest, numerics, traces, leaks), built once by the runner and handed to every
  hook; `inputs_hash`.
- ``finish.py``: after a campaign's deadline, each finding whose shrink it cut is shrunk further
  by Hypothesis (its choice sequence replayed through the example database, reuse and shrink
  phases only) within an extra budget, and says which features it could not drop; each finding
  on 2+ ranks is replayed on 1 rank with the same global sizes (`one_rank_path`), and reported
  there when it fails there too.
- ``fleet.py``: a fleet's findings (one `SET NX` document per signature version and signature,
  with its failure file) and workers' heartbeats in Redis; read back as untrusted input.
- ``fleet_worker.py``: a campaign as a fleet worker: heartbeats; each distinct finding offered
  to the fleet after its shrink (new, or a rediscovery counted with its shrink time).
- ``hooks.py``: declared hooks: on a finding, and before each example (deadlines).
- ``input_bounds.py``: a hand-made case's input size, measured with `FakeTensorMode` before any
  input is allocated.
- ``runner.py``: `Runner`: one case on a pool, then oracle, judge and report; statistics and
  timeouts.
- ``search.py``: the Hypothesis glue: the `@given` test, `run()` and `Result`.
- ``selforacle.py``: `Target(oracle="self")`: the implementation under test at world size 1, in
  float64 and in the case dtype, with its noise samples, run on a 1-rank pool, is the oracle.
- ``settings.py``: the shardfuzz Hypothesis profiles.
- ``shared_db.py``: `--database DIR|redis://...`: Hypothesis' `RedisExampleDatabase` (key prefix
  and channel per `--fleet`, 30-day expiry) multiplexed with the local directory database; a
  lost Redis is said once and the run goes on locally.
- ``stats.py``: the statistics of one run (examples, margins, closest passes, trigger shares,
  unsupported, excluded, external faults, leaks).
- ``trust.py``: the trust rule for the code a failure record names (`docs/trust.md`).
"""
