"""DDP-style data parallelism with gradient bucketing, against one process.

The model is registered in the order ``fc1``, ``head``, ``fc2`` (five parameters: ``fc1_weight``
``[hidden, d_in]``, ``fc1_bias``, ``head_weight`` ``[d_out, hidden]``, ``fc2_weight``
``[d_out, hidden]``, ``fc2_bias``): ``h = fc1(x)``, ``y = fc2(h) + head(h)``, where the option
``unused`` drops ``head`` from the loss on every rank (a parameter the loss does not use). Each
sample's loss is the pseudo-Huber loss ``sqrt(1 + r**2) - 1`` of the residual, summed over
``d_out``: its gradient ``r / sqrt(1 + r**2)`` is bounded, so two SGD steps on the ``large``
profile stay finite, and never exactly constant (a Huber loss's is ``sign(r)``: equal everywhere).

**The contract (what the oracle computes, in one process).** Each rank ``r`` of the group holds
its own batch (the global ``batch`` split by DTensor's rule, so uneven, and on a small batch a rank
holds none); each of ``micro`` micro-steps has its own samples. A rank's micro-step loss is the
*mean* over its own samples divided by ``micro`` (``sum / max(n_r, 1)``: a rank with no sample
has loss 0 and zero gradients, and still takes part in every all-reduce). DDP averages the
gradients of each rank's own loss, so the step's gradient is

    g = 1/W * sum_r 1/micro * sum_m grad(mean_{i in rank r} loss_i)

the mean of per-rank means, *not* the mean over the global batch when the batches are uneven.
Then plain SGD (``lr = 0.1``, no momentum or weight decay), for ``steps`` (1-2) steps. A parameter
that no rank uses has no gradient: ``None`` (torch's SGD skips it, and DDP leaves such a gradient
untouched). Outputs, per parameter ``p``, replicated (every rank is compared): ``grad_p``, the averaged
gradient of each step stacked (``[steps, *shape]``), and ``param_p``, the parameter after the last
step.

**The reference (a hand-written DDP reducer).** Parameters are assigned to buckets in *reverse*
registration order (the order their gradients tend to become ready), a bucket closing once it holds
at least ``cap`` bytes (option ``cap``, drawn tiny: several buckets occur; DDP's
``compute_bucket_assignment_by_size`` rule). A ``register_post_accumulate_grad_hook`` on every
parameter counts its bucket's ready gradients; when the last one is in, the bucket is flattened,
divided by the group size and all-reduced asynchronously (the overlap with the rest of backward).
At the end of backward the buckets still waiting (those holding a parameter that got no gradient)
are reduced with zeros in its place, every all-reduce is waited for and the averages are copied
back. Micro-steps before the last run under a ``no_sync``-style flag: the hooks do nothing and the
gradients accumulate locally. Its budget is exact: per step one all-reduce per bucket (``2 (W-1)/W``
x the bucket's bytes), and no single collective larger than the largest bucket, so the trace checks
the bucket sizes (``shardfuzz case ddp_buckets "Case(...)" --trace`` lists the buckets' all-reduces
in the order they fired).

**Real code:** ``torch.nn.parallel.DistributedDataParallel`` (gloo, CPU, ``bucket_cap_mb = cap /
2**20``), as implementations ``torch_ddp`` (defaults), ``torch_ddp_find_unused``
(``find_unused_parameters=True``) and ``torch_ddp_static_graph`` (``static_graph=True``), with
``ddp.no_sync()`` for the micro-steps before the last, then ``torch.optim.SGD``. DDP's own refusal
is a declared contract: without ``find_unused_parameters`` (or ``static_graph``) a parameter the
loss does not use is an error (``_check_reducer_finalized``, called after each backward:
"Expected to have finished reduction in the prior iteration"), which ``torch_ddp`` maps to
``Unsupported`` (counted), the way DDP documents it. Its C++ reducer's all-reduces are not in the
collective trace, so the torch implementations declare no budget.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import (
    CommBudget,
    Expect,
    ExpectedFailure,
    PlantedBug,
    Replicate,
    Shard,
    Target,
    Verified,
    bind,
)
from shardfuzz.errors import Unsupported
from shardfuzz.spec.budget import ITEMSIZE, all_reduce_bytes
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes

LR = 0.1
#: registration order (fc1, head, fc2); the buckets take them in reverse
PARAMS = ("fc1_weight", "fc1_bias", "head_weight", "fc2_weight", "fc2_bias")
HEAD = PARAMS.index("head_weight")
SIZES = {
    "batch": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True),
    "d_in": sst.Free(1, 3),
    "hidden": sst.Free(1, 4),
    "d_out": sst.Free(1, 3),
}


def cases(world_sizes=None):
    return sst.cases(
        "ddp_buckets",
        sizes=SIZES,
        # cap: the bucket byte cap, shrinking toward one parameter per bucket
        options={"unused": st.booleans(), "cap": st.integers(1, 48)},
        late_options={"micro": st.integers(1, 2), "steps": st.integers(1, 2)},
        world_sizes=world_sizes,
    )


def shapes(case) -> dict[str, tuple[int, ...]]:
    s = case.sizes
    return {
        "fc1_weight": (s["hidden"], s["d_in"]),
        "fc1_bias": (s["hidden"],),
        "head_weight": (s["d_out"], s["hidden"]),
        "fc2_weight": (s["d_out"], s["hidden"]),
        "fc2_bias": (s["d_out"],),
    }


def numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def buckets(case, cap: int | None = None) -> list[list[int]]:
    """Parameter indices per bucket: reverse registration order, a bucket closed once it holds
    ``cap`` bytes or more (DDP's rule); ``cap=None`` takes the case's."""
    cap = case.options["cap"] if cap is None else cap
    item, sizes = ITEMSIZE[case.dtype], shapes(case)
    out, cur, size = [], [], 0
    for i in reversed(range(len(PARAMS))):
        cur.append(i)
        size += numel(sizes[PARAMS[i]]) * item
        if size >= cap:
            out.append(cur)
            cur, size = [], 0
    return [*out, cur] if cur else out


def inputs(case):
    g, s = generator(case), case.sizes
    steps, micro = case.options["steps"], case.options["micro"]
    out = {name: randn(case, *shape, gen=g, role="weight") for name, shape in shapes(case).items()}
    out["x"] = randn(case, steps, micro, s["batch"], s["d_in"], gen=g)
    out["t"] = randn(case, steps, micro, s["batch"], s["d_out"], gen=g, role="cotangent")
    return out


def rank_loss(p, x, t, use_head: bool):
    """One rank's micro-step loss before the 1/micro: the mean pseudo-Huber loss over its own
    samples."""
    h = torch.nn.functional.linear(x, p["fc1_weight"], p["fc1_bias"])
    y = torch.nn.functional.linear(h, p["fc2_weight"], p["fc2_bias"])
    if use_head:
        y = y + torch.nn.functional.linear(h, p["head_weight"])
    r = y - t
    return (torch.sqrt(1 + r * r) - 1).sum() / max(x.shape[0], 1)


def oracle(inp, case):
    w, use_head = case.group_size, not case.options["unused"]
    steps, micro = case.options["steps"], case.options["micro"]
    sizes = split_sizes(case.sizes["batch"], w)
    offsets = split_offsets(case.sizes["batch"], w)
    p = {n: inp[n].clone().requires_grad_() for n in PARAMS}
    rows: dict[str, list] = {f"{k}_{n}": [] for k in ("grad", "param") for n in PARAMS}
    for s in range(steps):
        total = 0
        for lo, k in zip(offsets, sizes):
            for m in range(micro):
                x, t = inp["x"][s, m, lo : lo + k], inp["t"][s, m, lo : lo + k]
                total = total + rank_loss(p, x, t, use_head) / micro
        grads = torch.autograd.grad(total / w, [p[n] for n in PARAMS], allow_unused=True)
        for n, g in zip(PARAMS, grads):
            rows[f"grad_{n}"].append(g)
            new = p[n].detach() if g is None else (p[n] - LR * g).detach()
            rows[f"param_{n}"].append(new)
            p[n] = new.requires_grad_()
    return _outputs(rows)


def _outputs(rows: dict[str, list]) -> dict:
    """Each step's gradients stacked (``None`` for a parameter no rank uses), the last parameters."""
    out = {
        k: None if any(v is None for v in vs) else torch.stack(vs) for k, vs in rows.items() if k[0] == "g"
    }
    return {**out, **{k: vs[-1] for k, vs in rows.items() if k[0] == "p"}}


class Net(torch.nn.Module):
    """The model as modules, registered fc1, head, fc2 (the order DDP and the buckets see)."""

    def __init__(self, inp, use_head: bool) -> None:
        super().__init__()
        d_out, hidden = inp["fc2_weight"].shape
        self.fc1 = torch.nn.Linear(inp["fc1_weight"].shape[1], hidden, dtype=inp["x"].dtype)
        self.head = torch.nn.Linear(hidden, d_out, bias=False, dtype=inp["x"].dtype)
        self.fc2 = torch.nn.Linear(hidden, d_out, dtype=inp["x"].dtype)
        with torch.no_grad():
            for name, q in self.named_parameters():
                q.copy_(inp[name.replace(".", "_")])
        self.use_head = use_head

    def forward(self, x, t):  # the loss (DDP's forward hooks run when ddp(x, t) calls this)
        return rank_loss(dict(zip(PARAMS, self.parameters())), x, t, self.use_head)


def _run(ctx, net, micro_step, sgd_step):
    """The training loop every implementation shares: ``steps`` x ``micro`` micro-steps on this
    rank's samples, ``micro_step(x, t, m)`` (forward and backward), ``sgd_step()``; the stacked
    outputs."""
    opts, x, t = ctx.case.options, ctx.local["x"], ctx.local["t"]
    rows: dict[str, list] = {f"{k}_{n}": [] for k in ("grad", "param") for n in PARAMS}
    params = list(net.parameters())
    for s in range(opts["steps"]):
        for q in params:
            q.grad = None
        for m in range(opts["micro"]):
            micro_step(x[s, m], t[s, m], m)
        for n, q in zip(PARAMS, params):
            rows[f"grad_{n}"].append(None if q.grad is None else q.grad.detach().clone())
        sgd_step()
        for n, q in zip(PARAMS, params):
            rows[f"param_{n}"].append(q.detach().clone())
    return _outputs(rows)


class Reducer:
    """A DDP-style reducer: buckets of parameters, all-reduced from gradient hooks when full."""

    def __init__(self, params, bucket_ids, group, size: int, bug: str | None) -> None:
        self.params, self.buckets, self.group, self.size, self.bug = params, bucket_ids, group, size, bug
        self.of = {i: b for b, ids in enumerate(bucket_ids) for i in ids}
        self.sync = True
        self.handles = [q.register_post_accumulate_grad_hook(self._hook(i)) for i, q in enumerate(params)]

    def prepare(self, sync: bool) -> None:
        """Before a backward: ``sync=False`` is ``no_sync`` (accumulate locally)."""
        self.sync = sync
        self.ready: list[set[int]] = [set() for _ in self.buckets]
        self.fired: dict[int, tuple[torch.Tensor, list[int], object]] = {}

    def _hook(self, i: int):
        def hook(q) -> None:
            if not self.sync:
                return
            b = self.of[i]
            self.ready[b].add(i)
            need = len(self.buckets[b])
            if self.bug == "early_fire" and need > 1:  # the count of ready gradients starts at 1
                need -= 1
            if len(self.ready[b]) == need and b not in self.fired:
                self._fire(b)

        return hook

    def _fire(self, b: int) -> None:
        ids = self.buckets[b]
        have = [i for i in ids if i in self.ready[b]]  # gradients in the bucket when it fires
        flat = torch.cat(
            [
                self.params[i].grad.reshape(-1)
                if i in have
                else self.params[i].new_zeros(self.params[i].numel())
                for i in ids
            ]
        )
        flat.div_(self.size)
        if self.bug == "double_average":  # the user's loss already divided by the world size
            flat.div_(self.size)
        self.fired[b] = (flat, have, dist.all_reduce(flat, group=self.group, async_op=True))

    def finish(self) -> None:
        """After a backward: reduce the buckets still waiting, wait, copy the averages back."""
        if not self.sync:
            return
        for b in range(len(self.buckets)):
            if b not in self.fired and self.bug != "unused_not_reduced":
                self._fire(b)  # a parameter without a gradient: zeros in its place
        for b, (flat, have, work) in self.fired.items():
            work.wait()
            for i, piece in zip(
                self.buckets[b], flat.split([self.params[i].numel() for i in self.buckets[b]])
            ):
                q = self.params[i]
                if i in have and q.grad is not None:
                    q.grad.copy_(piece.view_as(q.grad))


def reference(ctx, *, bug: str | None = None):
    """The hand-written DDP reducer; ``bug`` plants one of the ``PLANTED`` bugs."""
    net = Net(ctx.inputs, not ctx.case.options["unused"])
    params = list(net.parameters())
    ids = [list(reversed(range(len(PARAMS))))] if bug == "one_bucket" else buckets(ctx.case)
    reducer = Reducer(params, ids, ctx.group, ctx.group_size, bug)
    last = ctx.case.options["micro"] - 1

    def micro_step(x, t, m):
        reducer.prepare(m == last or bug == "reduce_every_microstep")
        (net(x, t) / (last + 1)).backward()
        reducer.finish()

    def sgd_step():
        with torch.no_grad():
            for q in params:
                if q.grad is not None:
                    q.sub_(LR * q.grad)

    try:
        return _run(ctx, net, micro_step, sgd_step)
    finally:
        for h in reducer.handles:
            h.remove()


def torch_ddp(ctx, *, find_unused: bool = False, static_graph: bool = False, check: bool = True):
    """``torch.nn.parallel.DistributedDataParallel`` with a tiny ``bucket_cap_mb``; ``check``
    calls ``_check_reducer_finalized`` after each synced backward and maps DDP's refusal of unused
    parameters (its own error, raised alike on every rank) to ``Unsupported``."""
    from torch.nn.parallel import DistributedDataParallel

    opts = ctx.case.options
    net = Net(ctx.inputs, not opts["unused"])
    ddp = DistributedDataParallel(
        net,
        process_group=ctx.group,
        bucket_cap_mb=opts["cap"] / 2**20,
        find_unused_parameters=find_unused,
        static_graph=static_graph,
        broadcast_buffers=False,
    )
    sgd = torch.optim.SGD(net.parameters(), lr=LR)
    micro = opts["micro"]

    def micro_step(x, t, m):
        if m < micro - 1:  # no_sync covers the forward too: DDP prepares its reducer there
            with ddp.no_sync():
                (ddp(x, t) / micro).backward()
        else:
            (ddp(x, t) / micro).backward()
            if check:
                try:
                    ddp._check_reducer_finalized()
                except RuntimeError as e:  # DDP's documented refusal, exactly that one
                    if "Expected to have finished reduction" not in str(e):
                        raise
                    raise Unsupported(
                        f"DDP: {str(e).splitlines()[0]}",
                        reason="unused parameter without find_unused_parameters",
                    ) from e

    return _run(ctx, net, micro_step, sgd.step)


# -- triggers ----------------------------------------------------------------------------------------
def shares_bucket(case, i: int) -> bool:
    return any(i in b and len(b) > 1 for b in buckets(case))


TRIGGERS = {
    "backward": lambda c: True,
    "several buckets": lambda c: len(buckets(c)) >= 2,
    "a bucket of several parameters": lambda c: any(len(b) > 1 for b in buckets(c)),
    "unused parameter": lambda c: c.options["unused"],
    "unused parameter shares a bucket": lambda c: c.options["unused"] and shares_bucket(c, HEAD),
    "accumulation": lambda c: c.options["micro"] >= 2,
    "steps>=2": lambda c: c.options["steps"] >= 2,
    "a rank with batch 0": lambda c: 0 in split_sizes(c.sizes["batch"], c.group_size),
}


# -- the reference's budget and the planted bugs ------------------------------------------------------
def reference_comm(case) -> CommBudget:
    """Per step, one all-reduce per bucket on the last micro-step (the others are no_sync), none
    larger than the largest bucket."""
    sizes = [numel(s) for s in shapes(case).values()]
    per_bucket = [sum(sizes[i] for i in b) for b in buckets(case)]
    steps, n, item = case.options["steps"], case.group_size, ITEMSIZE[case.dtype]
    return CommBudget(
        sent=steps * sum(all_reduce_bytes(k, n, case.dtype) for k in per_bucket),
        collectives=steps * len(per_bucket),
        largest=max(per_bucket) * item,
        why="steps x one all-reduce per bucket (reverse registration order, closed at the byte cap)",
    )


PLANTED = [
    PlantedBug(
        "reduce_every_microstep",
        "no_sync ignored (wrapped around backward only, so DDP still reduces): every micro-step "
        "all-reduces its buckets; the averages add up to the right gradient, with micro x the "
        "communication (also karpathy/nanochat#33)",
        Expect(
            kind="communication",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: c.options["micro"] == 2,
            note="2 micro-steps",
        ),
        p95=1,
        link="baidu-baige/LoongForge#163",
    ),
    PlantedBug(
        "one_bucket",
        "the byte cap ignored: every gradient in one all-reduce after the whole backward (no "
        "overlap; what DDP itself does in its first iteration): right values and bytes, one "
        "collective larger than any bucket",
        Expect(
            kind="communication",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: len(buckets(c)) >= 2,
            note="cap 1 byte: a bucket per parameter",
            needs=("several buckets",),
        ),
        p95=1,
    ),
    PlantedBug(
        "double_average",
        "gradients divided by the world size twice: the loss divided by it by hand and the "
        "bucket averaged again (right at 1 rank)",
        Expect(kind="mismatch", world_size=2, mesh=(2,), uneven=None),
        p95=1,
        link="sanderwood/bgpt#5",
    ),
    PlantedBug(
        "early_fire",
        "a bucket's ready count starts at 1, so it fires before its last gradient is in; that "
        "gradient stays local, unreduced (needs a bucket of 2+ parameters and 2+ ranks)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: any(len(b) > 1 for b in buckets(c)),
            note="a bucket of 2 parameters",
            needs=("a bucket of several parameters",),
        ),
        p95=2,
        link="NVIDIA/Megatron-LM#1012",
    ),
    PlantedBug(
        "unused_not_reduced",
        "no end-of-backward pass for buckets whose hooks never all fire: a bucket holding an "
        "unused parameter is never reduced, so the used gradients beside it stay local (needs "
        "an unused parameter sharing a bucket, and 2+ ranks)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["unused"] and shares_bucket(c, HEAD),
            note="the unused parameter shares a bucket",
            needs=("unused parameter", "unused parameter shares a bucket"),
        ),
        p95=2,
        link="facebookresearch/fairscale#228",
    ),
]

DDP = "torch_ddp"
#: the region of torch_ddp_static_graph's expected failure, set aside to fuzz the rest of it
STATIC_GRAPH_NO_SYNC = "options['micro'] >= 2"

EXPECTED = [
    ExpectedFailure(
        "torch_ddp_static_graph_no_sync",
        "DDP(static_graph=True) with no_sync() accumulation crashes on its first synced backward: "
        "'expect_autograd_hooks_ INTERNAL ASSERT FAILED' in reducer.cpp (fix proposed in "
        "pytorch/pytorch#187732, which also reports wrong gradients from the second iteration "
        "once unblocked); fuzz the rest with --exclude \"options['micro'] >= 2\"",
        Expect(
            kind="rank-error",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: c.options["micro"] == 2,
            note="2 micro-steps",
        ),
        p95=1,
        link="pytorch/pytorch#143580",
        impl=bind(DDP, static_graph=True),
    ),
    ExpectedFailure(
        "torch_ddp_unchecked",
        "DDP without find_unused_parameters on a loss that leaves a parameter unused: backward "
        "returns local, unreduced gradients without an error (its one first-iteration bucket "
        "never becomes ready); DDP raises only at the next forward, so a single step or the "
        "last micro-step of a loop is silently wrong. _check_reducer_finalized() after "
        "backward catches it (torch_ddp calls it)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["unused"] and c.options["steps"] == 1,
            note="an unused parameter, 1 step",
            exclude=("options['steps'] >= 2",),
        ),
        p95=1,
        impl=bind(DDP, check=False),
    ),
]


OUTPUTS = {f"{k}_{n}": Replicate() for k in ("grad", "param") for n in PARAMS}


# torch's DistributedDataParallel: tests/test_verified.py runs each one
VERIFIED = [
    Verified(
        name="torch_ddp",
        what="torch DDP with its default settings; a case with an unused parameter is DDP's own "
        "refusal (find_unused_parameters=False)",
        examples=20,
        reaches=("several buckets", "a bucket of several parameters", "accumulation", "steps>=2"),
        refuses=("unused parameter without find_unused_parameters",),
    ),
    Verified(
        name="torch_ddp_find_unused",
        what="torch DDP with find_unused_parameters=True",
        examples=20,
        reaches=("unused parameter", "unused parameter shares a bucket", "accumulation", "steps>=2"),
    ),
    Verified(
        name="torch_ddp_static_graph",
        what="torch DDP with static_graph=True, no_sync accumulation set aside (the expected failure "
        "torch_ddp_static_graph_no_sync, pytorch/pytorch#143580)",
        examples=20,
        exclude=(STATIC_GRAPH_NO_SYNC,),
        reaches=("several buckets", "unused parameter", "steps>=2"),
    ),
]

TARGET = Target(
    name="ddp_buckets",
    description="DDP gradient bucketing: a byte cap, all-reduces fired from gradient hooks, unused "
    "parameters, no_sync accumulation, uneven per-rank batches; vs one process; torch DDP",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": Shard(2), "t": Shard(2)},
    outputs=OUTPUTS,
    implementations={
        "reference": "reference",
        "torch_ddp": DDP,
        "torch_ddp_find_unused": bind(DDP, find_unused=True),
        "torch_ddp_static_graph": bind(DDP, static_graph=True),
    },
    planted=PLANTED,
    expected_failures=EXPECTED,
    verified=VERIFIED,
    triggers=TRIGGERS,
    gradients=tuple(f"grad_{n}" for n in PARAMS),
    comm={"reference": reference_comm},
    collectives=("all_reduce",),
)
