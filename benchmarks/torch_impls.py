"""PyTorch's own sharded code, built in as implementations of built-in targets: N examples of each
in float32 and in bfloat16 under the ``shardfuzz-fuzz`` profile (random seeds, Hypothesis steering
towards the closest pass), known-failure regions set aside and counted.

    python benchmarks/torch_impls.py [--examples 500] [--dtypes float32,bfloat16] [IMPL ...]

``IMPL`` is ``target:impl`` (default: every entry of ``TORCH_IMPLS``). Prints, per implementation
and dtype, the examples run, failures (must be 0: these are the implementations restricted to
what torch supports), what was set aside (``Unsupported`` by reason, excluded known failures by
reason), the worst passing error/tolerance (the closest pass) and the time; a failure's report
follows its line. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from shardfuzz.targets.ddp_buckets import STATIC_GRAPH_NO_SYNC
from shardfuzz.targets.vocab_parallel import LOSS_PARALLEL_KNOWN

#: (target, implementation, pinned options, known failures to exclude[, other RunConfig fields]):
#: each a torch implementation restricted to what torch supports; its findings are the target's
#: ExpectedFailure records
TORCH_IMPLS: list[tuple] = [
    ("tp_mlp", "torch_tp_dtensor", {}, ()),
    ("zero_adamw_torch", "zero_redundancy_optimizer", {}, ()),
    ("zero_adamw_torch", "fsdp2", {}, ()),
    ("zero_adamw_torch", "fsdp2_hsdp", {}, (), {"world_sizes": (4,)}),  # HSDP 2 x 2: groups of 4
    ("ring_attention", "torch_cp_ring_even", {"lse_grad": False}, ()),
    ("ring_attention", "torch_cp_ring_even_a2a", {"lse_grad": False}, ()),
    (
        "vocab_parallel",
        "torch_loss_parallel",
        {"rule": "dtensor", "smoothing": 0.0},
        tuple(LOSS_PARALLEL_KNOWN.values()),  # the two crashes' regions
    ),
    ("tp_mlp", "torch_sp_even", {}, ()),
    ("tp_mlp", "torch_sp_dtensor", {}, ()),
    ("redistribute", "torch_redistribute", {}, ()),
    ("ring_allreduce", "torch_all_reduce", {}, ()),
    ("ring_allreduce", "torch_rs_ag", {}, ()),
    ("ddp_buckets", "torch_ddp", {}, ()),  # unused parameters: DDP's refusal, Unsupported
    ("ddp_buckets", "torch_ddp_find_unused", {}, ()),
    ("ddp_buckets", "torch_ddp_static_graph", {}, (STATIC_GRAPH_NO_SYNC,)),  # pytorch/pytorch#143580
    ("pipeline_1f1b", "torch_pipeline", {}, ()),
]


def _set_aside(stats) -> str:
    parts = [f"unsupported {k} x{v}" for k, v in sorted(stats.unsupported.items())]
    parts += [f"excluded {k} x{v}" for k, v in sorted(stats.excluded.items())]
    return "; ".join(parts) or "-"


def main(argv=None) -> int:
    import shardfuzz

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impls", nargs="*", help="target:impl (default: all of TORCH_IMPLS)")
    p.add_argument("--examples", type=int, default=500)
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    chosen = [e for e in TORCH_IMPLS if not args.impls or f"{e[0]}:{e[1]}" in args.impls]
    unknown = set(args.impls) - {f"{e[0]}:{e[1]}" for e in TORCH_IMPLS}
    if unknown:
        p.error(f"unknown IMPL {sorted(unknown)}; known: {[f'{e[0]}:{e[1]}' for e in TORCH_IMPLS]}")
    print(f"# loadavg {os.getloadavg()}, {os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(
        f"{'target:impl':<40} {'dtype':<9} {'examples':>8} {'failures':>8} {'worst pass':>10} {'time':>7}  set aside"
    )
    bad = 0
    for target, impl, options, exclude, *more in chosen:
        for dtype in args.dtypes.split(","):
            t0 = time.perf_counter()
            r = shardfuzz.run(
                target,
                impl,
                profile="shardfuzz-fuzz",
                max_examples=args.examples,
                database=None,
                dtypes=(dtype,),
                options=options,
                exclude=exclude,
                **(more[0] if more else {}),
            )
            bad += r.found
            print(
                f"{target + ':' + impl:<40} {dtype:<9} {r.stats.examples:>8} {r.stats.failures:>8} "
                f"{r.stats.worst_pass_ratio:>10.3g} {time.perf_counter() - t0:>6.0f}s  {_set_aside(r.stats)}",
                flush=True,
            )
            if r.found:
                print(r.report)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
