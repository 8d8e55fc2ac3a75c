#@ The standalone reproducer (`shardfuzz repro --standalone`): the script it writes is this file with
#@ its marks filled in by shardfuzz.repro.standalone (shardfuzz.repro.codegen.fill_template). Lines
#@ that start with `#@` are never written. What goes in, and how:
#@   {{NAME}}             a value, written as a Python literal (repr, pprint): no text of the failure
#@                        file is ever pasted as code. {{impl_name}} is the implementation's function
#@                        name, checked to be an identifier.
#@   `#@ insert NAME`     code copied from the implementation's own module: its source, and the
#@                        imports it needs beside the harness's (one sorted block)
#@   `#@ if NAME`, `#@ if not NAME` ... `#@ else` ... `#@ end`
#@                        a part of the harness written only when the case needs it: `ctx.mesh` and
#@                        the like when the implementation's code uses them (`ctx.extras`: any of
#@                        them), `Unsupported` when it raises shardfuzz's Unsupported, `inputs.pt`
#@                        when the inputs are too large to inline (they go to SCRIPT.pt beside it),
#@                        `inputs.strided` when the case hands layout-free inputs over as strided
#@                        views (shardfuzz's strided_view is then copied in with the implementation),
#@                        `shard.blocks` when a layout is a fused Shard (blocks > 1), `float.names`
#@                        when a value below is written with inf or nan (a case option norm_type=inf)
#@ The scripts written from it are compared byte for byte with examples/upstream/, blank lines
#@ included (tests/test_standalone.py). Package data (pyproject.toml), not a module: not linted.
{{doc}}

#@ insert imports
#@ if Unsupported


class Unsupported(Exception):
    """The implementation refuses this case (shardfuzz counts it; here it is an error)."""

    def __init__(self, message, reason=None):
        super().__init__(message)
#@ end


# -- the implementation under test --------------------------------------------------------------
#@ insert impl


# -- the case, its inputs, the oracle's values and the allowed error ----------------------------
#@ if float.names
inf, nan = float("inf"), float("nan")  # the non-finite values below, as repr writes them
#@ end
CASE = {{case}}
#@ if inputs.pt
DATA = torch.load(os.path.splitext(os.path.abspath(__file__))[0] + ".pt", weights_only=True)  # tensors only
#@ else
DATA = {}
#@ end
INPUTS = {{inputs}}
EXPECTED = {{expected}}
ALLOWED = {{allowed}}
OUTPUT_LAYOUTS = {{layouts}}
#@ if ctx.local
INPUT_LAYOUTS = {{input_layouts}}
#@ if inputs.strided
STRIDED = {{strided}}  # the layout-free inputs, handed over as non-contiguous views (strided_view)
#@ end
#@ end


def split(size, parts, rule):
    """Shard sizes: DTensor's rule (ceil(size / parts) until they run out) or torch.tensor_split's."""
    if rule == "dtensor":
        chunk = -(-size // parts)
        return [max(0, min(chunk, size - chunk * r)) for r in range(parts)]
    return [size // parts + (r < size % parts) for r in range(parts)]


def piece(value, layout, rank, parts):
#@ if padded_flat
    if layout[0] == "padded_flat":  # ZeRO's flat buffer: ceil(n / parts) a rank, the last padded
        chunk = -(-value.shape[0] // parts)
        start = min(rank * chunk, value.shape[0])
        return value[start : start + max(0, min(chunk, value.shape[0] - start))]
#@ end
    if layout[0] != "shard":
        return value
    dim, rule = layout[1], layout[2]
#@ if shard.blocks
    if len(layout) > 3 and layout[3] > 1:  # a fused dim: this rank's shard of each equal block, in order
        m = value.shape[dim] // layout[3]
        blocks = [piece(value.narrow(dim, b * m, m), layout[:3], rank, parts) for b in range(layout[3])]
        return torch.cat(blocks, dim=dim)
#@ end
    sizes = split(value.shape[dim], parts, rule)
    return value.narrow(dim, sum(sizes[:rank]), sizes[rank])


#@ if outputs.dtensor
def dtensor_local_shape(d):
    """The local shape a DTensor's placements promise this rank (Shard: DTensor's chunk rule, mesh
    axes in order); None for a placement this script does not lay out (_StridedShard)."""
    shape, coord = list(d.shape), d.device_mesh.get_coordinate()
    for axis, p in enumerate(d.placements):
        if type(p).__name__ == "Shard":
            shape[p.dim] = split(shape[p.dim], d.device_mesh.size(axis), "dtensor")[coord[axis]]
        elif p.is_shard():
            return None
    return shape


#@ end
#@ if ctx.mesh
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
        #@ if mesh.groups
        # this rank's process group along each axis (ctx.mesh.groups[0]: its dp group on a dp x tp
        # mesh), every group of every axis made by every rank in one order (new_group is collective)
        self.groups = tuple(self._group(grid, axis, rank) for axis in range(len(self.shape)))
        #@ end
        #@ if inputs.dtensor
        self._device_mesh = None
        #@ end

    #@ if mesh.groups
    def _group(self, grid, axis, rank):
        mine = None
        for members in grid.movedim(axis, -1).reshape(-1, self.shape[axis]).tolist():
            group = dist.new_group(members)
            if rank in members:
                mine = group
        return mine

    #@ end
    def device_mesh(self):
        #@ if inputs.dtensor
        if self._device_mesh is not None:  # one mesh per case, as shardfuzz's: the inputs live on it
            return self._device_mesh
        #@ end
        from torch.distributed.device_mesh import init_device_mesh

        names = (*(f"axis{i}" for i in range(len(self.shape) - 1)), "impl")
        #@ if inputs.dtensor
        self._device_mesh = init_device_mesh(self.device.type, self.shape, mesh_dim_names=names)
        return self._device_mesh
        #@ else
        return init_device_mesh(self.device.type, self.shape, mesh_dim_names=names)
        #@ end


#@ end
#@ if inputs.dtensor
def as_dtensor(value, layout, device_mesh):
    """An input handed over as a DTensor (shardfuzz's AsDTensor): each rank takes its piece of the
    full input itself, no collective."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    placements = [Shard(p[1]) if p[0] == "shard" else Replicate() for p in layout[1]]
    mesh = device_mesh if layout[2] == "all" else device_mesh["impl"]
    return distribute_tensor(value, mesh, placements, src_data_rank=None)


#@ end
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
        #@ if ctx.mesh
        self.mesh = Mesh(shape, device, self.rank)
        #@ end
        #@ if ctx.local
        #@ if inputs.dtensor
        self.local = {
            k: as_dtensor(v, INPUT_LAYOUTS[k], self.mesh.device_mesh())
            if INPUT_LAYOUTS[k][0] == "dtensor"
            else piece(v, INPUT_LAYOUTS[k], self.group_rank, self.group_size)
            for k, v in self.inputs.items()
        }
        #@ else
        self.local = {k: piece(v, INPUT_LAYOUTS[k], self.group_rank, self.group_size) for k, v in self.inputs.items()}
        #@ end
        #@ if inputs.strided
        for k in STRIDED:
            self.local[k] = strided_view(self.local[k])
        #@ end
        #@ end
    #@ if ctx.shard

    def shard(self, value, layout):
        #@ if shard.blocks
        spec = ("shard", layout.dim, getattr(layout, "rule", "dtensor"), getattr(layout, "blocks", 1))
        return piece(value, spec, self.group_rank, self.group_size)
        #@ else
        return piece(value, ("shard", layout.dim, getattr(layout, "rule", "dtensor")), self.group_rank, self.group_size)
        #@ end
    #@ end
    #@ if ctx.dtype

    @property
    def dtype(self):
        return getattr(torch, CASE["dtype"])
    #@ end
#@ if not ctx.extras
#@ (a Ctx without the members above is followed by three blank lines, as in the scripts written
#@ so far; with any of them, by two)

#@ end


def check(ctx, outputs):
    wrong = []  # every wrong output of this rank, in the target's order, as the report lists them
    for name, layout in OUTPUT_LAYOUTS.items():
        got = outputs[name]
        if got is None or EXPECTED[name] is None:  # "no value" on both sides is nothing to compare
            if (got is None) != (EXPECTED[name] is None):
                raise AssertionError(f"rank {ctx.rank}: output {name!r} is {got!r}, expected {EXPECTED[name]!r}")
            continue
        if hasattr(got, "full_tensor"):  # a DTensor: its local piece where it says, then the whole value
#@ if outputs.dtensor
            promised = dtensor_local_shape(got)
            if promised is not None and list(got.to_local().shape) != promised:
                raise AssertionError(
                    f"rank {ctx.rank}: output {name!r} holds a local piece of shape {list(got.to_local().shape)}, "
                    f"where its placements {got.placements} on global shape {list(got.shape)} put {promised}"
                )
#@ end
            got = got.full_tensor()
#@ if outputs.dtensor
        elif layout[0] == "dtensor":  # declared FromDTensor(): a plain tensor breaks the contract
            raise AssertionError(f"rank {ctx.rank}: output {name!r} must be a DTensor, got {type(got).__name__}")
#@ end
        elif layout[0] == "partial":
            got = got.clone()
            dist.all_reduce(got, group=ctx.group)
#@ if outputs.owned
        elif layout[0] == "owned" and ctx.group_rank != layout[1] % ctx.group_size:  # not its owner
            if tuple(got.shape) != (0,):
                raise AssertionError(
                    f"rank {ctx.rank}: output {name!r} has shape {list(got.shape)}; group rank "
                    f"{layout[1] % ctx.group_size} owns it, and every other rank holds an empty tensor, shape [0]"
                )
            continue
#@ end
        want = piece(EXPECTED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                     ctx.group_rank, ctx.group_size)
#@ if padded_flat
        if layout[0] == "padded_flat" and not hasattr(got, "full_tensor"):  # its padding is never compared
            chunk = -(-EXPECTED[name].shape[0] // ctx.group_size)
            if tuple(got.shape) != (chunk,):
                raise AssertionError(f"rank {ctx.rank}: output {name!r} has shape {list(got.shape)}, expected [{chunk}]")
            got = got[: want.shape[0]]
#@ end
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
        check(ctx, {{impl_name}}(ctx, **{{kwargs}}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
