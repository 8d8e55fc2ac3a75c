"""A tiny target for engine tests: a sharded sum, with implementations that fail in every way."""

import os
import re
import signal
import sys
import time
import weakref

import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import Partial, Replicate, Shard, Target, Unsupported, bind
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["n"], gen=generator(case))}


def oracle(inp, case):
    x = inp["x"]
    return {"total": x.sum().reshape(1), "x2": 2 * x, "parts": x, "count": torch.tensor([x.numel()])}


def magnitude(inp, case):
    """The sum of |terms| behind each output: a sum over ranks in another order may cancel."""
    a = inp["x"].abs()
    return {"total": a.sum().reshape(1), "x2": 2 * a, "parts": a}


def reference(ctx, *, use_device_mesh=False):
    group = ctx.group
    if use_device_mesh:  # the DeviceMesh of the whole mesh; the axis under test is named "impl"
        mesh = ctx.mesh.device_mesh()
        assert mesh.mesh_dim_names[-1] == "impl" and tuple(mesh.shape) == tuple(ctx.case.mesh)
        group = mesh.get_group("impl")
    local = ctx.local["x"]
    total = local.sum().reshape(1)
    dist.all_reduce(total, group=group)
    parts = torch.zeros_like(ctx.inputs["x"])
    start = Shard(0).global_index((0,), ctx.group_rank, ctx.group_size, tuple(parts.shape))[0]
    parts[start : start + local.numel()] = local
    count = torch.tensor([local.numel()])
    dist.all_reduce(count, group=group)
    return {"total": total, "x2": 2 * local, "parts": parts, "count": count}


def crash_rank1(ctx):
    if ctx.group_rank == 1:
        print("rank 1 is about to fail", flush=True)
        raise ValueError("boom on rank 1")
    return reference(ctx)


_KEPT = []


def crash_rank1_keeps_group(ctx):
    """``crash_rank1``, but every rank keeps its group (as a cache of the implementation would): it
    stays open after the error, so the pool cannot regroup and is replaced."""
    _KEPT.append(ctx.group)
    return crash_rank1(ctx)


def crash_all_keeps_group(ctx):
    """Every rank keeps its group and raises (as DTensor code leaves its group referenced from
    torch's C++ side after a symmetric error): no rank is blocked on the group, so the pool
    regroups in place, until KEPT_GROUPS such groups pile up on a rank."""
    _KEPT.append(ctx.group)
    raise ValueError(f"boom on rank {ctx.group_rank}")


def hang_rank0(ctx):
    if ctx.group_rank == 0:
        time.sleep(3600)
    return reference(ctx)


def segfault_rank1(ctx):
    if ctx.group_rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return reference(ctx)


def wrong_rank1(ctx):
    out = reference(ctx)
    if ctx.group_rank == 1:
        out["x2"] = out["x2"] + 1
    return out


def two_bugs(ctx):
    """Two bugs of different kinds: rank 1's ``x2`` is off by one (a mismatch from 2 ranks on), and
    rank 2 raises (a rank error, 3 ranks or more)."""
    if ctx.group_rank == 2:
        raise IndexError("rank 2 has no shard to give")
    return wrong_rank1(ctx)


def two_crashes(ctx):
    """Two bugs of one kind: rank 1 dies on exactly 2 ranks, rank 2 raises on 3 ranks or more (two
    distinct rank errors, each with a failure file of its own)."""
    if ctx.group_rank == 1 and ctx.group_size == 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    return two_bugs(ctx) if ctx.group_rank == 2 else reference(ctx)


def wrong_shape(ctx):
    out = reference(ctx)
    out["x2"] = torch.cat([out["x2"], out["x2"][:1]])
    return out


def wrong_count(ctx):
    out = reference(ctx)
    out["count"] = out["count"] + 1
    return out


def slow_rank0(ctx, *, seconds=5.0):
    """Slow, not stuck: rank 0 computes (a pure-Python loop) for ``seconds`` before the collectives."""
    if ctx.group_rank == 0:
        end, n = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            n += 1
    return reference(ctx)


def skip_collective_rank1(ctx):
    """Stuck: rank 1 returns without entering the all-reduce that rank 0 waits in."""
    if ctx.group_rank == 1:
        x = ctx.local["x"]
        return {
            "total": x.sum().reshape(1),
            "x2": 2 * x,
            "parts": ctx.inputs["x"],
            "count": torch.tensor([1]),
        }
    return reference(ctx)


def check_clean(ctx):
    """The reference, but it raises when an earlier example's global state is still there."""
    found = (torch.get_default_dtype(), torch.is_grad_enabled())
    if found != (torch.float32, True):
        raise AssertionError(f"rank {ctx.rank} started with default dtype and grad mode {found}")
    return reference(ctx)


def imports_frozen(ctx):
    """The reference, but it raises unless the rank's imports (torch: ~240,000 objects) are out of
    the garbage collector's sight (a full collection then skips them)."""
    import gc

    if gc.get_freeze_count() < 100_000:
        raise AssertionError(f"rank {ctx.rank}: {gc.get_freeze_count()} objects frozen")
    return reference(ctx)


def leak_default_dtype(ctx):
    """Right outputs, then leaves float64 as the default dtype (and grad mode off) behind."""
    out = reference(ctx)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    return out


def leak_process_group(ctx):
    """Creates a process group in every example and never destroys it (fds and threads pile up)."""
    dist.new_group(list(range(ctx.world_size)))
    return reference(ctx)


#: the group derived from each case group, as FSDP2's HSDP mesh is: made once per group object
_DERIVED: dict = {}


def derived_group_per_case_group(ctx):
    """Makes a group of its own over the case group's ranks the first time it sees that case
    group (an object), and reuses it after: a correct cache, that leaves one group per case group."""
    key = id(ctx.group)
    held, group = _DERIVED.get(key, (None, None))
    if held is None or held() is not ctx.group:
        group = dist.new_group(list(range(ctx.world_size)))
        _DERIVED[key] = (weakref.ref(ctx.group), group)
    dist.all_reduce(torch.zeros(1), group=group)
    return reference(ctx)


def killed_from_outside_once(ctx):
    """Rank 1 writes its pid to ``options['pidfile']`` and waits to be killed from outside, the
    first time only; a rerun finds the file and is the reference."""
    path = ctx.case.options["pidfile"]
    if ctx.group_rank == 1 and not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        time.sleep(30)
    return reference(ctx)


def gil_held_rank0(ctx):
    """Rank 0 touches ``options['marker']``, then backtracks in a regex for ever: C code that
    holds the GIL, so no other thread of the rank (its watchdog) runs again."""
    if ctx.group_rank == 0:
        open(ctx.case.options["marker"], "w").close()
        re.match(r"(a+)+$", "a" * 64 + "b")
    return reference(ctx)


def kill_forkserver_once(ctx):
    """Rank 0 kills the forkserver that started the ranks (its parent), the first time only (the
    marker file ``options['marker']``), as a ``kill -9`` from a user or the OOM killer may: every
    rank dies with it (exit code 255, as multiprocessing sees it). A rerun is the reference."""
    if ctx.group_rank == 0:
        try:
            os.close(os.open(ctx.case.options["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return reference(ctx)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)  # PR_SET_PDEATHSIG ends this rank at once
    return reference(ctx)


def dies_on_odd_runs(ctx):
    """Rank 1 exits (code 3) on the 1st, 3rd, 5th... run of the case (it counts them in the file
    ``options['counter']``): a death that recurs only sometimes."""
    if ctx.group_rank == 1:
        with open(ctx.case.options["counter"], "a") as f:
            f.write("x")
        if os.path.getsize(ctx.case.options["counter"]) % 2:
            os._exit(3)
    return reference(ctx)


def fails_once_then_refused(ctx, *, counter, at):
    """The reference, but the ``at``-th case it runs (counted in the file ``counter``) is wrong and
    every later one refused as unsupported: a failure that Hypothesis' replay does not see fail
    again (a nondeterministic kernel whose second run takes another path)."""
    out = reference(ctx)
    seen = torch.tensor([os.path.getsize(counter) if os.path.exists(counter) else 0])
    dist.all_reduce(seen, op=dist.ReduceOp.MIN)  # the world's ranks decide alike, on any mesh
    if ctx.rank == 0:
        with open(counter, "a") as f:
            f.write("x")
    if int(seen) > at:
        raise Unsupported("refused after its failure", reason="refused after its failure")
    if int(seen) == at:
        out["total"] = out["total"] + 1
    return out


def aborts_on_odd_runs(ctx):
    """On the 1st, 3rd, 5th... run of the case (counted in the file ``options['counter']``) the
    ranks all-gather chunks of different sizes: gloo's size check throws in rank 1, uncaught, and
    libstdc++ aborts the process (a death the rank causes itself, as torch's SP TP on an uneven
    sequence does); on the other runs, the reference."""
    if ctx.group_rank == 1:
        with open(ctx.case.options["counter"], "a") as f:
            f.write("x")
    dist.barrier(group=ctx.group)  # rank 0 reads the count rank 1 wrote
    if os.path.getsize(ctx.case.options["counter"]) % 2:
        mine = torch.zeros(2 if ctx.group_rank == 0 else 1)
        out = torch.zeros(mine.numel() * ctx.group_size)
        dist.all_gather_into_tensor(out, mine, group=ctx.group)
    return reference(ctx)


def peer_killed_then_aborts_once(ctx):
    """The first time (no file ``options['marker']`` yet): rank 1 is killed from outside (rank 0
    sends the SIGKILL) inside a collective, and rank 0 then dies as a survivor can, aborting with
    libstdc++'s line for gloo's size check on stderr. Later runs pass."""
    marker, pidfile = ctx.case.options["marker"], ctx.case.options["pidfile"]
    if os.path.exists(marker):
        return reference(ctx)
    if ctx.group_rank == 1:
        with open(pidfile + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pidfile + ".part", pidfile)  # whole when it appears
        dist.barrier(group=ctx.group)  # killed in here
    deadline = time.monotonic() + 30
    while not os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.01)
    open(marker, "w").close()
    with open(pidfile) as f:
        os.kill(int(f.read()), signal.SIGKILL)
    os.write(2, b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n")
    os.abort()


def dies_after_closing_rank1(ctx):
    """Rank 1 closes its connections to its peers (they fail at once: connection closed) and dies
    a second later: a death that its peers see before the driver can."""
    if ctx.group_rank == 1:
        _shut_tcp_sockets()
        time.sleep(ctx.case.options.get("delay", 1.0))
        os._exit(3)
    return reference(ctx)


def _shut_tcp_sockets():
    """Shut down this process's TCP connections (gloo's, the store's); the driver's pipes are Unix
    sockets and stay open, so the driver sees this rank alive until it exits."""
    import socket

    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            inodes |= {line.split()[9] for line in list(f)[1:]}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            sock = socket.socket(fileno=int(fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.detach()


LEAKED = "SHARDFUZZ_TOY_LEAKED"


def leak_environment(ctx):
    """Right outputs, then sets an environment variable and changes the working directory."""
    out = reference(ctx)
    os.environ[LEAKED] = "1"
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    return out


def reads_environment(ctx):
    """The reference, but its outputs follow an environment variable and the working directory, as
    code reading a configuration variable or a relative path does: right in a clean process."""
    out = reference(ctx)
    if os.environ.get(LEAKED) or os.getcwd() == os.path.dirname(os.path.abspath(__file__)):
        out["x2"] = out["x2"] + 1
    return out


def killed_once_and_leaky(ctx):
    """Rank 1 is SIGKILLed in the first example only (it creates the file
    ``$SHARDFUZZ_FAILURES_DIR.killed-once``: the tests set the variable before any rank starts),
    and every example leaks an environment variable and a working directory."""
    if ctx.group_rank == 1:
        marker = os.environ["SHARDFUZZ_FAILURES_DIR"] + ".killed-once"
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return leak_environment(ctx)


def sigkill_rank1(ctx):
    """Rank 1 is SIGKILLed on every run: reproducible, so a finding, not an external fault."""
    if ctx.group_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return reference(ctx)


def abort_rank1(ctx):
    """Rank 1 aborts as a C++ exception does (gloo's size check under an uneven all-gather): the
    message libstdc++ prints, then SIGABRT."""
    if ctx.group_rank == 1:
        sys.stderr.write(
            "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
            "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:446] "
            "Received data size doesn't match expected size\n"
        )
        sys.stderr.flush()
        os.abort()
    return reference(ctx)


def cases(world_sizes=None):
    return sst.cases(
        "toy",
        sizes={"n": sst.Split(max_per_rank=2)},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("normal",),
    )


TOY = Target(
    name="toy",
    description="sharded sum",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    magnitude=magnitude,
    outputs={"total": Replicate(), "x2": Shard(0), "parts": Partial(), "count": Replicate()},
    input_layouts={"x": Shard(0)},
    implementations={
        "reference": "reference",
        "crash_rank1": "crash_rank1",
        "crash_rank1_keeps_group": "crash_rank1_keeps_group",
        "crash_all_keeps_group": "crash_all_keeps_group",
        "hang_rank0": "hang_rank0",
        "segfault_rank1": "segfault_rank1",
        "wrong_rank1": "wrong_rank1",
        "wrong_shape": "wrong_shape",
        "two_bugs": "two_bugs",
        "two_crashes": "two_crashes",
        "wrong_count": "wrong_count",
        "via_device_mesh": bind("reference", use_device_mesh=True),
        "killed_from_outside_once": "killed_from_outside_once",
        "gil_held_rank0": "gil_held_rank0",
        "derived_group_per_case_group": "derived_group_per_case_group",
        "sigkill_rank1": "sigkill_rank1",
        "abort_rank1": "abort_rank1",
        "kill_forkserver_once": "kill_forkserver_once",
        "dies_on_odd_runs": "dies_on_odd_runs",
        "aborts_on_odd_runs": "aborts_on_odd_runs",
        "fails_once_then_refused": "fails_once_then_refused",
        "peer_killed_then_aborts_once": "peer_killed_then_aborts_once",
        "dies_after_closing_rank1": "dies_after_closing_rank1",
        "leak_environment": "leak_environment",
        "reads_environment": "reads_environment",
        "killed_once_and_leaky": "killed_once_and_leaky",
        "slow_rank0": "slow_rank0",
        "skip_collective_rank1": "skip_collective_rank1",
        "check_clean": "check_clean",
        "imports_frozen": "imports_frozen",
        "leak_default_dtype": "leak_default_dtype",
        "leak_process_group": "leak_process_group",
    },
)
