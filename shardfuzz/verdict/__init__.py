"""Stage ``verdict`` (layer 3 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

Pure functions of a case, the ranks' replies and the expected values: the oracle, the noise
model and its rules, the comparison, the judge, communication accounting. No process is started
here. Imports core, spec and ranks' records.

- ``comm.py``: communication accounting from the traces (bytes per rank and op by the bandwidth-
  optimal formulas), the alpha-beta estimates, and `CommBudget`, the per-implementation upper
  bound behind the `communication` finding.
- ``compare.py``: the elementwise comparison kernel and the description of the worst elements.
- ``decide.py``: `decide(case, replies, expected, config)`: the one verdict procedure (judge
  without the noise term, noise samples where the verdict needs them, a recheck of a failing
  verdict that is not gross).
- ``judge.py``: checks the replies' layouts and values against the oracle, giving a `Verdict`.
- ``noise.py``: the rounding-noise model: Monte Carlo arithmetic on the oracle under a
  `TorchDispatchMode`.
- ``noise_rules.py``: which aten ops the noise model perturbs, and the rules of fused ops.
- ``oracle.py``: evaluates the oracle for a case, in float64 and in the case dtype, and its
  noise samples.
"""
