"""PyTorch's own vocab parallelism as implementations of ``vocab_parallel``: torchtitan's plan.

``parallelize_module`` shards the embedding with ``RowwiseParallel(input_layouts=Replicate())``
(the vocab dim of the table: torch masks the ids outside a rank's rows and all-reduces) and the
output projection with ``ColwiseParallel(use_local_output=False)`` (logits stay a DTensor sharded
on the vocab dim); the loss is ``F.cross_entropy`` under ``loss_parallel()``, forward and backward.
Its gradients are returned as DTensors, so the engine reads their placements.

Contract: torch shards by DTensor's rule, so cases with ``rule=tensor_split`` are ``Unsupported``
(counted; pin ``--option rule=dtensor``); ``loss_parallel`` documents label smoothing as not
supported, so cases with ``smoothing > 0`` are ``Unsupported`` too (``smoothing=True`` runs them
anyway: the loss is silently wrong, an expected failure). Two crashes are expected failures of
the target (found and shrunk by the fuzzer, ``EXPECTED`` in ``vocab_parallel.py``): class weights
with ignored labels crash the backward, and a rank that holds no class crashes the forward.
``vocab_parallel.LOSS_PARALLEL_KNOWN`` holds their regions as ``--exclude`` expressions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardfuzz import Unsupported
from shardfuzz.targets.vocab_parallel import IGNORE


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
