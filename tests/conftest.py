import os
import time
import types

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().split(") ")[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, IndexError, ValueError):
                pass
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children_of(todo.pop())
        out += kids
        todo += kids
    return out


def _wait_gone(pids, seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA: skipped cleanly (and said so) on machines without it."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (run bash .ci/gpu-checks on a GPU machine)")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture
def procs():
    """Helpers to find a process's descendants and wait for them to be gone (Linux /proc)."""
    return types.SimpleNamespace(alive=_alive, descendants=_descendants, wait_gone=_wait_gone)
