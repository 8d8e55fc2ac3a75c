"""Reproducer: vocab_parallel / torch_loss_parallel_weight_ignore (rank-error).

1 rank(s), mesh (1,); sizes batch=1, seq=2, d_model=1, vocab=2; float32; options {'smoothing': 0.0, 'rule': 'dtensor', 'class_weight': True, 'ignore_index': True, 'reduction': 'none'}.
Run: torchrun --nproc-per-node=1 repro_vocab_parallel_torch_loss_parallel_weight_ignore.py    (add --backend nccl for GPUs)
Needs only torch (written with torch 2.13.0+cpu by shardfuzz 0.1.0 on 2026-12-07). Each rank runs the
implementation below on its inputs and compares its outputs with the oracle's float64 values,
within the tolerance shardfuzz allows a mismatch after its recheck (a report of a mismatch far
past it shows the narrower bound before the recheck, which it skips there); every wrong output of
a rank, or an error, fails the run. A rank stuck in a collective (a hang) fails after
COLLECTIVE_TIMEOUT_S seconds instead of waiting forever.
"""

import datetime
import os
import random
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F


class Unsupported(Exception):
    """The implementation refuses this case (shardfuzz counts it; here it is an error)."""

    def __init__(self, message, reason=None):
        super().__init__(message)


# -- the implementation under test --------------------------------------------------------------
class _Model(torch.nn.Module):
    def __init__(self, emb, w_out):
        super().__init__()
        v, d = emb.shape
        self.tok_embeddings = torch.nn.Embedding(v, d, dtype=emb.dtype)
        self.output = torch.nn.Linear(d, v, bias=False, dtype=w_out.dtype)
        with torch.no_grad():
            self.tok_embeddings.weight.copy_(emb)
            self.output.weight.copy_(w_out)

    def forward(self, tokens):
        return self.output(self.tok_embeddings(tokens))


IGNORE = -100


def torch_loss_parallel(ctx, *, smoothing: bool = False):
    """torchtitan's embedding / output plan and ``loss_parallel`` cross-entropy, forward and backward."""
    try:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            loss_parallel,
            parallelize_module,
        )
    except ImportError as e:  # an older torch: refused, counted
        raise Unsupported(f"this torch has no loss_parallel: {e}", reason="no loss_parallel") from e

    case, inp = ctx.case, ctx.inputs
    if case.options["rule"] != "dtensor":
        raise Unsupported("torch shards the vocab by DTensor's rule (pin rule=dtensor)", reason="rule")
    if case.options["smoothing"] and not smoothing:
        raise Unsupported("loss_parallel does not support label smoothing (documented)", reason="smoothing")
    model = _Model(inp["emb"], inp["w_out"])
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(use_local_output=False),
    }
    parallelize_module(model, ctx.mesh.device_mesh()["impl"], plan)
    logits = model(inp["tokens"])
    with loss_parallel():
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            inp["labels"].flatten(),
            weight=inp.get("class_weight"),
            ignore_index=IGNORE,
            reduction=case.options["reduction"],
        )
        loss = loss.full_tensor().view(inp["dloss"].shape)  # replicated: no communication
        loss.backward(inp["dloss"])
    # the gradients are DTensors (Shard(0) by DTensor's rule): the engine reads their placements
    return {
        "loss": loss.detach(),
        "grad_emb": model.tok_embeddings.weight.grad,
        "grad_w_out": model.output.weight.grad,
    }


# -- the case, its inputs, the oracle's values and the allowed error ----------------------------
CASE = {'world_size': 1,
 'mesh': (1,),
 'sizes': {'batch': 1, 'seq': 2, 'd_model': 1, 'vocab': 2},
 'dtype': 'float32',
 'options': {'smoothing': 0.0,
             'rule': 'dtensor',
             'class_weight': True,
             'ignore_index': True,
             'reduction': 'none'},
 'seed': 0}
DATA = {}
INPUTS = {
    'tokens': torch.tensor([[0, 1]], dtype=torch.int64),
    'labels': torch.tensor([[0, -100]], dtype=torch.int64),
    'emb': torch.tensor([[-1.0845223665237427], [-1.3985954523086548]], dtype=torch.float32),
    'w_out': torch.tensor([[0.40334683656692505], [0.8380263447761536]], dtype=torch.float32),
    'dloss': torch.tensor([[-0.7192575931549072, -0.40334352850914]], dtype=torch.float32),
    'class_weight': torch.tensor([1.235140085220337, 1.8446670770645142], dtype=torch.float32),
}
EXPECTED = {
    'loss': torch.tensor([[0.5989977723757708, 0.0]], dtype=torch.float64),
    'grad_emb': torch.tensor([[-0.14839454795429394], [0.0]], dtype=torch.float64),
    'grad_w_out': torch.tensor([[-0.37024337077593816], [0.37024337077593816]], dtype=torch.float64),
}
ALLOWED = {
    'loss': torch.tensor([[9.789685009309324e-07, 5.049173523730133e-08]], dtype=torch.float32),
    'grad_emb': torch.tensor([[4.869699523624149e-07], [1.2508724722692932e-08]], dtype=torch.float32),
    'grad_w_out': torch.tensor([[8.683537657816487e-07], [3.8083834397184546e-07]], dtype=torch.float32),
}
OUTPUT_LAYOUTS = {'loss': ('replicate',), 'grad_emb': ('shard', 0, 'dtensor'), 'grad_w_out': ('shard', 0, 'dtensor')}


def split(size, parts, rule):
    """Shard sizes: DTensor's rule (ceil(size / parts) until they run out) or torch.tensor_split's."""
    if rule == "dtensor":
        chunk = -(-size // parts)
        return [max(0, min(chunk, size - chunk * r)) for r in range(parts)]
    return [size // parts + (r < size % parts) for r in range(parts)]


def piece(value, layout, rank, parts):
    if layout[0] != "shard":
        return value
    dim, rule = layout[1], layout[2]
    sizes = split(value.shape[dim], parts, rule)
    return value.narrow(dim, sum(sizes[:rank]), sizes[rank])


class Mesh:
    def __init__(self, shape, device, rank):
        self.shape, self.device = tuple(shape), device
        # this rank's place on the mesh and the global ranks of its group along each axis, as
        # shardfuzz's ctx.mesh has them (torch's TP and FSDP2 targets read ranks[-1])
        grid = torch.arange(torch.Size(self.shape).numel()).view(self.shape)
        self.coords = tuple(int(c) for c in (grid == rank).nonzero()[0])
        self.ranks = tuple(
            tuple(grid[self.coords[:axis] + (slice(None),) + self.coords[axis + 1 :]].tolist())
            for axis in range(len(self.shape))
        )

    def device_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        names = (*(f"axis{i}" for i in range(len(self.shape) - 1)), "impl")
        return init_device_mesh(self.device.type, self.shape, mesh_dim_names=names)


class Ctx:
    """What shardfuzz hands the implementation, cut down to this case."""

    def __init__(self, device):
        shape = CASE["mesh"]
        self.case = type("Case", (), dict(CASE, group_size=shape[-1]))()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device
        # the group under test: this rank's row of the mesh's last axis
        rows = [list(range(s, s + shape[-1])) for s in range(0, self.world_size, shape[-1])]
        groups = [dist.new_group(r) for r in rows]
        self.group = groups[self.rank // shape[-1]]
        self.group_rank, self.group_size = self.rank % shape[-1], shape[-1]
        self.inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in INPUTS.items()}
        self.mesh = Mesh(shape, device, self.rank)


def check(ctx, outputs):
    wrong = []  # every wrong output of this rank, in the target's order, as the report lists them
    for name, layout in OUTPUT_LAYOUTS.items():
        got = outputs[name]
        if got is None or EXPECTED[name] is None:  # "no value" on both sides is nothing to compare
            if (got is None) != (EXPECTED[name] is None):
                raise AssertionError(f"rank {ctx.rank}: output {name!r} is {got!r}, expected {EXPECTED[name]!r}")
            continue
        if hasattr(got, "full_tensor"):  # a DTensor: its local piece where it says, then the whole value
            got = got.full_tensor()
        elif layout[0] == "partial":
            got = got.clone()
            dist.all_reduce(got, group=ctx.group)
        want = piece(EXPECTED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                     ctx.group_rank, ctx.group_size)
        if tuple(got.shape) != tuple(want.shape):  # a wrong shape would broadcast in the comparison
            raise AssertionError(f"rank {ctx.rank}: output {name!r} has shape {list(got.shape)}, expected {list(want.shape)}")
        if name not in ALLOWED:
            if not torch.equal(got.cpu(), want):
                wrong.append(f"rank {ctx.rank}: {name} = {got}, expected {want}")
            continue
        allowed = piece(ALLOWED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                        ctx.group_rank, ctx.group_size).double()
        err = (got.detach().cpu().double() - want).abs()
        bad = ~(err <= allowed)
        if bad.any():
            ratio = (err / allowed).nan_to_num(float("inf")).max().item()
            wrong.append(
                f"rank {ctx.rank}: output {name!r}: {int(bad.sum())} of {err.numel()} elements wrong, "
                f"worst {ratio:.3g}x the allowed error\n  got      {got}\n  expected {want}"
            )
    if wrong:
        raise AssertionError("\n".join(wrong))
    print(f"rank {ctx.rank}: all outputs within the allowed error", flush=True)


# a rank stuck in a collective (a hang) fails after this instead of waiting for the default timeout
COLLECTIVE_TIMEOUT_S = 120


def main():
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        ctx = Ctx(device)
        # the random state the ranks had: an implementation that draws (an init, a dropout) draws the same
        torch.manual_seed(CASE["seed"])
        random.seed(CASE["seed"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(CASE["seed"] % 2**32)
        check(ctx, torch_loss_parallel(ctx, **{}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
