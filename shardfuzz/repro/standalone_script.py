"""The text of a standalone reproducer (:mod:`shardfuzz.repro.standalone` fills it in): the harness that
stands in for shardfuzz under torchrun, in plain torch."""

SHIM_UNSUPPORTED = '''

class Unsupported(Exception):
    """The implementation refuses this case (shardfuzz counts it; here it is an error)."""

    def __init__(self, message, reason=None):
        super().__init__(message)
'''

MESH_CLASS = """class Mesh:
    def __init__(self, shape, device):
        self.shape, self.device = tuple(shape), device

    def device_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        names = (*(f"axis{i}" for i in range(len(self.shape) - 1)), "impl")
        return init_device_mesh(self.device.type, self.shape, mesh_dim_names=names)


"""

#: RankContext members a standalone ``ctx`` has only when the implementation's code uses them
#: (as ``ctx.NAME``: the implementation's parameter is ``ctx`` by convention)
CTX_EXTRAS = {
    "ctx.mesh": "        self.mesh = Mesh(shape, device)",
    "ctx.local": "        self.local = {k: piece(v, INPUT_LAYOUTS[k], self.group_rank, self.group_size) "
    "for k, v in self.inputs.items()}",
    "ctx.shard(": """
    def shard(self, value, layout):
        return piece(value, ("shard", layout.dim, getattr(layout, "rule", "dtensor")), self.group_rank, self.group_size)""",
    "ctx.dtype": """
    @property
    def dtype(self):
        return getattr(torch, CASE["dtype"])""",
}

DATA_LOAD = 'DATA = torch.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "inputs.pt"))'

#: the script's docstring (written as a literal by :func:`shardfuzz.repro.codegen.docstring`)
DOC = """Reproducer: {title}.

{world} rank(s), mesh {mesh}; sizes {sizes}; {dtype}; options {options}.
Run: torchrun --nproc-per-node={world} {script}    (add --backend nccl for GPUs)
Needs only torch (written with torch {torch} by shardfuzz {version} on {date}). Each rank runs the
implementation below on its inputs and compares its outputs with the oracle's float64 values,
within the tolerance shardfuzz allowed; a wrong element or an error fails the run.
"""

#: the script: ``doc`` and every data value are literals (``repr``/``pprint``); ``impl`` is the
#: implementation's own source
TEMPLATE = '''{doc}

{imports}
{shims}

# -- the implementation under test --------------------------------------------------------------
{impl}


# -- the case, its inputs, the oracle's values and the allowed error ----------------------------
CASE = {case}
{data_load}
INPUTS = {inputs}
EXPECTED = {expected}
ALLOWED = {allowed}
OUTPUT_LAYOUTS = {layouts}
{input_layouts}

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


{mesh_class}class Ctx:
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
        self.inputs = {{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in INPUTS.items()}}
{ctx_extras}


def check(ctx, outputs):
    for name, layout in OUTPUT_LAYOUTS.items():
        got = outputs[name]
        if hasattr(got, "full_tensor"):  # a DTensor: compare the whole value
            got = got.full_tensor()
        elif layout[0] == "partial":
            got = got.clone()
            dist.all_reduce(got, group=ctx.group)
        want = piece(EXPECTED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                     ctx.group_rank, ctx.group_size)
        if name not in ALLOWED:
            assert torch.equal(got.cpu(), want), f"rank {{ctx.rank}}: {{name}} = {{got}}, expected {{want}}"
            continue
        allowed = piece(ALLOWED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                        ctx.group_rank, ctx.group_size).double()
        err = (got.detach().cpu().double() - want).abs()
        bad = ~(err <= allowed)
        if bad.any():
            ratio = (err / allowed).nan_to_num(float("inf")).max().item()
            raise AssertionError(
                f"rank {{ctx.rank}}: output {{name!r}}: {{int(bad.sum())}} of {{err.numel()}} elements wrong, "
                f"worst {{ratio:.3g}}x the allowed error\\n  got      {{got}}\\n  expected {{want}}"
            )
    print(f"rank {{ctx.rank}}: all outputs within the allowed error", flush=True)


def main():
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "gloo"
    dist.init_process_group(backend)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        ctx = Ctx(device)
        check(ctx, {fname}(ctx, **{kwargs!r}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
