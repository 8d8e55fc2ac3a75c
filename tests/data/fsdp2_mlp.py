"""FSDP2 (fully_shard) training steps on a small MLP with LayerNorm, vs a one-process oracle.

Written from the docs by a new user (stop 59): two of its correct cases were false findings
(tests/test_noise.py::test_fsdp2s_own_steps_that_a_new_user_found_falsely_reported_pass).
"""

import torch
import torch.distributed as dist
from hypothesis import strategies as st

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn

LR = 0.1
PARAMS = ("w1", "b1", "ln_w", "ln_b", "w2", "b2")


def cases(world_sizes=None):
    return sst.cases(
        "fsdp2_mlp",
        sizes={
            "batch": sst.Split(),
            "d_in": sst.Free(1, 4),
            "hidden": sst.Free(1, 6),
            "d_out": sst.Free(1, 3),
        },
        options={"opt": st.sampled_from(["sgd", "adam"]), "clip": sst.mostly(0.0, 0.5)},
        late_options={"steps": st.integers(1, 2)},
        world_sizes=world_sizes,
    )


def inputs(case):
    s, g = case.sizes, generator(case)
    B, di, h, do = s["batch"], s["d_in"], s["hidden"], s["d_out"]
    return {
        "x": randn(case, B, di, gen=g),
        "y": randn(case, B, do, gen=g),
        "w1": randn(case, h, di, gen=g, role="weight"),
        "b1": randn(case, h, gen=g, role="weight"),
        "ln_w": 1.0 + 0.1 * randn(case, h, gen=g, role="weight"),
        "ln_b": randn(case, h, gen=g, role="weight"),
        "w2": randn(case, do, h, gen=g, role="weight"),
        "b2": randn(case, do, gen=g, role="weight"),
    }


class MLP(torch.nn.Module):
    def __init__(self, inp, dtype):
        super().__init__()
        h, di = inp["w1"].shape
        do = inp["w2"].shape[0]
        self.lin1 = torch.nn.Linear(di, h, dtype=dtype)
        self.ln = torch.nn.LayerNorm(h, dtype=dtype)
        self.lin2 = torch.nn.Linear(h, do, dtype=dtype)
        with torch.no_grad():
            for mod, name, key in [
                (self.lin1, "weight", "w1"),
                (self.lin1, "bias", "b1"),
                (self.ln, "weight", "ln_w"),
                (self.ln, "bias", "ln_b"),
                (self.lin2, "weight", "w2"),
                (self.lin2, "bias", "b2"),
            ]:
                getattr(mod, name).copy_(inp[key].to(dtype))

    def forward(self, x):
        return self.lin2(torch.tanh(self.ln(self.lin1(x))))

    def named(self):
        return {
            "w1": self.lin1.weight,
            "b1": self.lin1.bias,
            "ln_w": self.ln.weight,
            "ln_b": self.ln.bias,
            "w2": self.lin2.weight,
            "b2": self.lin2.bias,
        }


def make_opt(params, case):
    if case.options["opt"] == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9)
    return torch.optim.Adam(params, lr=LR * 0.1)


def _oracle(inp, case, master_dtype=None):
    x, y = inp["x"], inp["y"]
    cdt = x.dtype
    mdt = master_dtype(cdt) if master_dtype else cdt
    model = MLP(inp, mdt)
    opt = make_opt(list(model.parameters()), case)
    n = y.numel()
    losses = []
    for _ in range(case.options["steps"]):
        out = (
            torch.func.functional_call(model, {k: v.to(cdt) for k, v in model.named_parameters()}, (x,))
            if mdt != cdt
            else model(x)
        )
        loss = ((out - y) ** 2).sum() / n
        loss.backward()
        losses.append(loss.detach())
        if case.options["clip"]:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), case.options["clip"])
        opt.step()
        opt.zero_grad()
    res = {k: v.detach().clone() for k, v in model.named().items()}
    res["loss"] = torch.stack(losses)
    return res


def oracle(inp, case):
    return _oracle(inp, case)


def oracle_mp(inp, case):  # master params in promote(dtype, float32), compute in the case dtype
    return _oracle(inp, case, lambda d: torch.promote_types(d, torch.float32))


def _train(ctx, *, mp=False, bug=None, reduce_dtype=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    case = ctx.case
    cdt = ctx.dtype
    mdt = torch.promote_types(cdt, torch.float32) if mp else cdt
    mesh = ctx.mesh.device_mesh()["impl"]
    model = MLP(ctx.inputs, mdt)
    kw = {}
    if mp:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=cdt, reduce_dtype=reduce_dtype or torch.promote_types(cdt, torch.float32)
        )
    fully_shard(model.lin1, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    opt = make_opt(list(model.parameters()), case)
    x, y = ctx.local["x"], ctx.local["y"]
    n_global = case.sizes["batch"] * case.sizes["d_out"]
    G = ctx.group_size
    losses = []
    for _ in range(case.options["steps"]):
        out = model(x)
        sq = ((out - y) ** 2).sum()
        if bug == "local_mean":  # each rank's own mean; FSDP2 averages over ranks
            loss = sq / y.numel()
            rep = loss.detach().clone()
            dist.all_reduce(rep, group=ctx.group)
            rep = rep / G
        else:
            loss = sq / n_global * G  # FSDP2 divides the gradient sum by G
            rep = sq.detach().clone()
            dist.all_reduce(rep, group=ctx.group)
            rep = rep / n_global
        loss.backward()
        losses.append(rep)
        if case.options["clip"]:
            params = list(model.parameters())
            if bug == "local_clip":  # norm of this rank's shard only
                local = torch.stack([p.grad.to_local().norm() for p in params]).norm()
                coef = torch.clamp(case.options["clip"] / (local + 1e-6), max=1.0)
                for p in params:
                    p.grad.to_local().mul_(coef)
            else:
                torch.nn.utils.clip_grad_norm_(params, case.options["clip"])
        opt.step()
        opt.zero_grad()
    res = dict(model.named())  # DTensors, Shard(0)
    res["loss"] = torch.stack(losses)
    return res


def reference(ctx):
    return _train(ctx)


def mixed_precision(ctx):
    return _train(ctx, mp=True)


def mp_reduce_in_param_dtype(ctx):  # bug: reduce_dtype left at param_dtype (bf16 reduce-scatter)
    return _train(ctx, mp=True, reduce_dtype=ctx.dtype)


def local_mean(ctx):
    return _train(ctx, bug="local_mean")


def local_clip(ctx):
    return _train(ctx, bug="local_clip")


OUTS = {k: shardfuzz.FromDTensor() for k in PARAMS}
OUTS["loss"] = shardfuzz.Replicate()

TARGET = shardfuzz.Target(
    name="fsdp2_mlp",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    input_layouts={"x": shardfuzz.Shard(0), "y": shardfuzz.Shard(0)},
    outputs=OUTS,
    implementations={"reference": reference, "local_mean": local_mean, "local_clip": local_clip},
)

MP = TARGET.derive(
    "fsdp2_mlp_mp",
    oracle=oracle_mp,
    implementations={"mixed_precision": "mixed_precision", "mp_reduce_bf16": "mp_reduce_in_param_dtype"},
)
