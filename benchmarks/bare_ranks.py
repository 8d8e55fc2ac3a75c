"""The ranks of ``bench_tp.py``'s bare floor: what a hand-written differential test costs.

Each rank joins a plain gloo group once, then for every case it is sent: builds the inputs, takes
its shard, calls the implementation and sends its outputs back. No state reset, no leak check, no
collective trace, no timeout watch, no warnings capture: only the work itself. The driver side is
:func:`BareFloor.run`: it computes the float64 oracle while the ranks work and calls
``torch.testing.assert_close`` with fixed tolerances.
"""

from __future__ import annotations

import os
from typing import Any

#: fixed tolerances of the hand-written test (torch's own defaults for the dtype, as such a test
#: would use); the noise model exists because fixed ones both miss bugs and flag correct results
FIXED = {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float64": (1e-7, 1e-7)}


def rank_loop(rank: int, world: int, store_info: tuple, target_ref: str, impl_ref: str, conn: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from shardfuzz.ranks.task import RankContext, RankState
    from shardfuzz.spec.placements import local_input
    from shardfuzz.spec.refs import load_ref
    from shardfuzz.spec.registry import resolve_worker_target

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    host, port, prefix = store_info
    store = dist.PrefixStore(prefix, dist.TCPStore(host, port, is_master=False))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    target, impl = resolve_worker_target(target_ref), load_ref(impl_ref, "impl")
    state = RankState(rank, world, torch.device("cpu"), 120.0)  # its meshes only (cached groups)
    conn.send("ready")
    while True:
        case = conn.recv()
        if case is None:
            break
        mesh = state.mesh(tuple(case.mesh), 120.0)
        gr, gs = mesh.coords[-1], case.mesh[-1]
        inputs = target.inputs(case)
        local = {k: local_input(target.input_layout(k), v, mesh, gr, gs) for k, v in inputs.items()}
        ctx = RankContext(case, rank, world, mesh.groups[-1], gr, gs, mesh, inputs, local, state.device, None)
        out = impl(ctx)
        conn.send({k: v.detach() for k, v in out.items()})
    dist.destroy_process_group()


class BareFloor:
    """Warm bare ranks per world size, and the driver's loop over cases."""

    def __init__(self, target: Any, target_ref: str, impl_ref: str, worlds: list[int]) -> None:
        import uuid

        from shardfuzz.ranks.spawn import context, driver_store, no_main_import

        self.target = target
        store = driver_store()
        self.ranks: dict[int, list[tuple[Any, Any]]] = {}
        ctx = context()
        with no_main_import():
            for w in worlds:
                info = ("127.0.0.1", store.port, f"bare-{uuid.uuid4().hex}/")
                procs = []
                for r in range(w):
                    mine, theirs = ctx.Pipe()
                    p = ctx.Process(
                        target=rank_loop, args=(r, w, info, target_ref, impl_ref, theirs), daemon=True
                    )
                    p.start()
                    procs.append((p, mine))
                self.ranks[w] = procs
        for procs in self.ranks.values():
            for _, conn in procs:
                assert conn.recv() == "ready"

    def run(self, cases: list[Any]) -> int:
        """Every case once; returns how many the fixed tolerances flagged (on a correct reference)."""
        import torch

        flagged = 0
        for case in cases:
            procs = self.ranks[case.world_size]
            for _, conn in procs:
                conn.send(case)
            inputs = self.target.inputs(case)  # the oracle in float64, while the ranks work
            up = {
                k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in inputs.items()
            }
            ref = self.target.oracle(up, case)
            locals_ = [conn.recv() for _, conn in procs]
            rtol, atol = FIXED[case.dtype]
            g = case.group_size
            try:
                for name, layout in self.target.outputs_for(case).items():
                    want = ref[name].detach().to(getattr(torch, case.dtype))
                    for r, out in enumerate(locals_):
                        piece = layout.piece(want, layout.index_of(r, g), g)
                        torch.testing.assert_close(out[name], piece, rtol=rtol, atol=atol)
            except AssertionError:
                flagged += 1
        return flagged

    def stop(self) -> None:
        for procs in self.ranks.values():
            for _, conn in procs:
                conn.send(None)
            for p, _ in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
