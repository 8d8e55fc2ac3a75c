"""Run one case with ranks started by ``torchrun`` (several GPUs or nodes), without Hypothesis.

    torchrun --nproc-per-node=N -m shardfuzz.repro.torchrun FAILURE.json [--backend nccl]
    torchrun --nproc-per-node=N repro.py [--backend nccl]        (written by ``shardfuzz repro``)

Under torchrun there is no driver: every rank runs the implementation on the group under test,
then the locals are gathered to rank 0 through a *separate* CPU gloo group (never the group under
test), and rank 0 runs the oracle, compares, and prints the result. Every rank exits with rank 0's
verdict: 0 passes, 1 still fails, 2 usage error (a bad file or option), 3 no device to run it on
(nccl without one CUDA device per rank).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import pprint
import sys
from typing import Any

import torch
import torch.distributed as dist

import shardfuzz
from shardfuzz.case import Case
from shardfuzz.engine import failures
from shardfuzz.engine.config import BACKENDS, DEVICES, RunConfig, default_device
from shardfuzz.engine.failures import record_impl, record_target
from shardfuzz.engine.finding import inputs_hash
from shardfuzz.engine.runner import Runner
from shardfuzz.engine.selforacle import refuse
from shardfuzz.engine.trust import add_trust_option
from shardfuzz.errors import Finding, InfrastructureError, InvalidArgument
from shardfuzz.protocol import ErrorReply, Task, UnsupportedReply
from shardfuzz.ranks.gpu import check_placement
from shardfuzz.ranks.task import RankState, select_device
from shardfuzz.ranks.trace import install
from shardfuzz.ranks.worker import answer
from shardfuzz.repro.codegen import FLOAT_NAMES_LINE, check_script, docstring, uses_float_names


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardfuzz.repro.torchrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", nargs="?", help="failure file (omit when the record is embedded)")
    p.add_argument("--backend", choices=BACKENDS, default=None)
    p.add_argument("--device", choices=DEVICES, default=None)
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout in seconds")
    p.add_argument("--deterministic", action="store_true")
    add_trust_option(p)
    return p


def main(argv: list[str] | None = None, record: dict[str, Any] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = _parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:  # every rank validates the record the same way, before any process group exists
        if not (args.timeout > 0 and math.isfinite(args.timeout)):
            raise InvalidArgument(f"--timeout={args.timeout!r}; must be a number of seconds > 0")
        if record is None:
            if not args.file:
                raise InvalidArgument("give a failure file (FILE)")
            record = failures.load(args.file, trust_refs=args.trust_refs)
        else:  # the script itself is the code the user chose to run: what it names is trusted
            embedded = {"format": failures.FORMAT, "report": "", **record}  # scripts written before 0.2
            script = os.path.abspath(sys.argv[0] or "repro.py")
            record = failures.prepare(embedded, script, trust_refs=True)
        target, spec = record_target(record)
    except InvalidArgument as e:
        if rank == 0:
            print(f"shardfuzz.repro.torchrun: error: {e}", file=sys.stderr)
        return 2
    case: Case = record["case"]
    backend = args.backend or record["backend"]
    # the file's device, unless the run names another backend (whose default device it takes)
    device = args.device or (record["device"] if backend == record["backend"] else default_device(backend))
    if world != case.world_size:
        if rank == 0:
            print(
                f"shardfuzz.repro.torchrun: error: the case needs world_size={case.world_size} but torchrun started "
                f"{world} process(es); use torchrun --nproc-per-node={case.world_size}",
                file=sys.stderr,
            )
        return 2

    try:  # before a device is chosen: without one per rank, select_device divides by zero
        RunConfig(backend=backend, device=device)
        # this node's ranks: a GPU per rank is per node (2 nodes x 4 GPUs run a world of 8)
        check_placement(target, backend, device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    except (InvalidArgument, InfrastructureError) as e:
        if rank == 0:
            print(f"shardfuzz.repro.torchrun: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, InvalidArgument) else 3
    torch.set_num_threads(1)
    device_obj = select_device(backend, device, local_rank)
    bind_device: dict[str, Any] = {"device_id": device_obj} if device_obj.type == "cuda" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout), **bind_device)
    results_group = dist.new_group(backend="gloo")  # the locals travel here, never on the group under test
    install()  # the collective trace (the reply carries it; there is no driver to read a file)
    state = RankState(rank, world, device_obj, args.timeout)
    task = Task(
        case=case,
        target_ref=target.worker_ref(),
        impl=record["impl_spec"],
        timeout=args.timeout,
        deterministic=args.deterministic or bool(record.get("deterministic", False)),
        want_flags=True,
    )
    reply = answer(state, task)
    replies: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(reply, replies if rank == 0 else None, dst=0, group=results_group)
    code = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        code[0] = _judge_on_rank0(record, (target, spec), case, backend, device, replies)
    dist.broadcast(code, src=0, group=results_group)
    dist.destroy_process_group()
    return int(code[0])


def _judge_on_rank0(
    record: dict[str, Any],
    resolved: tuple[Any, str],
    case: Case,
    backend: str,
    device: str,
    replies: list[Any],
) -> int:
    target, _ = resolved
    runner = Runner(target, record_impl(target, record), RunConfig(backend=backend, device=device))
    print(
        f"shardfuzz.repro.torchrun: {record['target']}/{record['impl']} on {backend}/{device}, {len(replies)} ranks\n{case!r}"
    )
    errors = [(r, rep) for r, rep in enumerate(replies) if isinstance(rep, ErrorReply)]
    if errors:
        for r, rep in errors:
            print(f"Rank {r} terminated with the following error:\n{rep.traceback}")
        return 1
    refused = [rep.reason for rep in replies if isinstance(rep, UnsupportedReply)]
    if refused:
        print(f"UNSUPPORTED: {'; '.join(sorted(set(refused)))}")
        return 2
    expected = runner.expected(case)
    if record.get("inputs_sha256") and inputs_hash(runner.last_inputs) != record["inputs_sha256"]:
        print("note: the inputs differ from the ones recorded in the failure file (input hash changed)")
    print(f"numerics (rank 0): {replies[0].numerics}")
    try:
        ratio = runner.judge_replies(case, replies, expected)
    except Finding as f:
        print(f"FAIL ({f.kind})\n{f.report}")
        return 1
    print(f"PASS: worst error/tolerance {ratio:.3g} ({runner.tolerance.describe(case.dtype)})")
    return 0


REPRO_DOC = """A torchrun reproducer written by shardfuzz {version} on {date}.

{target}/{impl}: {kind} found on {backend}/{device}
{case_repr}

Run one process per rank with torchrun (on one machine or several):

    torchrun --nproc-per-node={world} {name} [--backend nccl] [--device cuda]

It needs shardfuzz installed and the implementation importable as {impl_ref!r} on every node
(a moved checkout: set SHARDFUZZ_PATH to its new folder); it does not use Hypothesis. Rank 0 prints the comparison; every rank exits 0 when the case passes
and 1 when it fails (torchrun then stops the ranks still running, SIGTERM, and exits 1 with its
own ChildFailedError summary after the report).
"""

#: the script; every value in it is a literal (codegen.docstring, repr): no field becomes code
REPRO_TEMPLATE = """#!/usr/bin/env python
{doc}

import sys

from shardfuzz.repro.torchrun import main
{float_names}
RECORD = {record}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], record=RECORD))
"""

#: the fields a torchrun script carries (validated again when it runs: failure_schema)
EMBEDDED = (
    "format",
    "version",
    "target",
    "target_ref",
    "target_worker_ref",
    "impl",
    "impl_ref",
    "impl_kwargs",
    "files",
    "backend",
    "device",
    "kind",
    "inputs_sha256",
    "deterministic",
)


def write_repro(record: dict[str, Any], path: str) -> str:
    """Write a standalone torchrun script for one (validated) failure record."""
    refuse(record_target(record)[0], "shardfuzz repro")  # rank 0 judges with the oracle function
    embedded = {k: record[k] for k in EMBEDDED if k in record}
    case = record["case"]
    embedded["case"] = case.to_dict()
    doc = REPRO_DOC.format(
        version=shardfuzz.__version__,
        date=datetime.date.today().isoformat(),
        target=record["target"],
        impl=record["impl"],
        kind=record["kind"],
        backend=record["backend"],
        device=record["device"],
        case_repr=repr(case),
        world=case.world_size,
        name=os.path.basename(path),
        impl_ref=record["impl_ref"],
    )
    record_text = pprint.pformat(embedded, width=100, sort_dicts=False)
    text = REPRO_TEMPLATE.format(
        doc=docstring(doc),
        record=record_text,
        float_names=f"\n{FLOAT_NAMES_LINE}\n" if uses_float_names(record_text) else "",
    )
    check_script(text, doc, {"RECORD": embedded})
    # -o out/repro.py: its folder is made, as --standalone makes its own
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


if __name__ == "__main__":
    sys.exit(main())
