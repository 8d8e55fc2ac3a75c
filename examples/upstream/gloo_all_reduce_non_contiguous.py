"""gloo's ``all_reduce`` on a non-contiguous tensor is silently wrong (torch 2.13.0, CPU).

Needs only torch. Upstream status: pytorch/pytorch#192920 (open) reports the same for gloo's
``scatter``, ``broadcast`` and ``reduce``; ``gather`` and ``all_gather`` were fixed in #158903.
``all_reduce`` is not named there; this script shows it is affected too. NCCL refuses a
non-contiguous tensor ("Tensors must be contiguous").

Found by shardfuzz on a user's row-parallel layer whose partial sum came out of a matmul transposed
on the rank holding 2 of 3 inner columns (tests/test_memory_layouts.py). Three cases, 2 ranks, the same
values on both:

1. transposed on every rank (dense, the same strides everywhere): right, since a sum of raw memory
   is elementwise when every rank lays the values out alike;
2. transposed on rank 0, contiguous on rank 1 (what the user's code did): wrong;
3. a column of a matrix on every rank (stride 3, not dense): wrong.

Run: ``python gloo_all_reduce_non_contiguous.py`` (forks 2 ranks), or
``torchrun --nproc-per-node 2 gloo_all_reduce_non_contiguous.py``. Exit status 1 while the bug is
there, 0 once every sum is right.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def check(rank: int) -> list[str]:
    """The three layouts: each all-reduce gets fresh tensors (an all-reduce writes through a view)."""

    def values() -> torch.Tensor:
        return torch.arange(6.0).reshape(2, 3)

    wrong = []
    cases = {
        # dense but transposed, the same strides on every rank: a sum of raw memory is still
        # elementwise here, so this one comes out right
        "transposed on every rank": lambda: values().t(),
        # what the user's code did: the partial sums laid out differently on the two ranks
        "transposed on rank 0, contiguous on rank 1": lambda: (
            values().t() if rank == 0 else values().t().contiguous()
        ),
        # a column: 2 elements, stride 3, on every rank
        "a column (stride 3) on every rank": lambda: values()[:, 1],
    }
    for name, make in cases.items():
        got, want = make(), 2 * make()
        dist.all_reduce(got)
        if not torch.equal(got, want):
            wrong.append(f"{name}: got {got.tolist()}, want {want.tolist()}")
    return wrong


def run(rank: int, world: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        wrong = check(rank)
    finally:
        dist.destroy_process_group()
    for line in wrong:
        print(f"rank {rank}: all_reduce wrong, {line}", flush=True)
    if wrong:
        sys.exit(1)


def _forked(rank: int) -> None:
    run(rank, 2)


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29561"))
        try:
            mp.start_processes(_forked, nprocs=2, start_method="fork")
        except mp.ProcessExitedException:
            sys.exit(1)
        print(f"all_reduce of non-contiguous tensors is right on gloo (torch {torch.__version__})")
