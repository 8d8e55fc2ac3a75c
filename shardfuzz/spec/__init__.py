"""Stage ``spec`` (layer 1 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

What a target author imports: the target spec and its records, layouts, inputs, the parallel
building blocks, triggers, the registry, exclusions, references, tolerances, communication
budgets and DTensor placements. Imports only the core.

- ``bounds.py``: what a target's strategy of cases declares it draws (`Split`, `Free`,
  `CaseBounds`: world sizes, mesh rank, sizes, profiles, option names), and the check of a case
  from elsewhere (a failure file) against it before its inputs are built.
- ``budget.py``: communication budgets as a target declares them (`CommBudget`,
  `Target(comm=...)`) and the byte formulas they are written with (`all_reduce_bytes`,
  `all_gather_bytes`, `ITEMSIZE`).
- ``decisions.py``: `decision()`, around a discrete decision the oracle and the ranks make with
  the same code on the same values: the noise model leaves its arithmetic exact.
- ``exclude.py``: known failures set aside: `--exclude` case expressions (checked against an AST
  allow-list) and `Target(known_failures=)`.
- ``inputs.py``: seeded input builders and value profiles, by role (activation, weight, logits,
  cotangent).
- ``layouts.py``: Shard/Replicate/Partial/PaddedFlat/Zigzag/Owned, which say how locals relate
  to global values.
- ``magnitudes.py``: optional magnitude helpers for user targets (matmul, softmax, attention,
  rotary embeddings, layer/RMS norm, cross-entropy, Adam).
- ``parallel.py``: building blocks that user targets may import: Megatron f/g, the sequence-
  parallel gather/reduce-scatter pair (by all-reduce), all-to-all with uneven splits.
- ``placements.py``: DTensor outputs: a rank sends its local piece with the placements, mesh and
  coordinate; the driver computes each rank's piece of the oracle's value with DTensor's rule
  and gives the judge a `Placed` layout.
- ``records.py``: `PlantedBug` and `ExpectedFailure` (one base, `KnownFailure`), `Expect`,
  `Verified` and `bind()`: the records a target file declares.
- ``refs.py``: import references for targets and implementations (`pkg.mod:attr`,
  `file.py::NAME`).
- ``registry.py``: built-in targets (discovered from ``targets/*.py``) and entry-point targets,
  and `get_target`.
- ``sampling.py``: the one case sampler: random cases of a strategy with their choice sequences,
  reproducible from a seed (`draw_pool`, `stable_seed`).
- ``target.py``: `Target`: the spec, its implementations, outputs per case, and `derive()`.
- ``tolerance.py``: the tolerance policy (`Tolerance`, `OutputTolerance`).
- ``triggers.py``: the generic trigger conditions of a case, plus a target's declared ones.
"""
