"""``shardfuzz case --plot FILE.png``: for each mismatching output, the oracle, the assembled
result, the error (``|actual - expected| / tolerance``) and the shard boundaries (lines where one
rank's piece ends).

matplotlib is an optional extra (``pip install "shardfuzz[plot]"``), imported only here, inside the
functions, and drawn with the Agg canvas (no display, no change to the caller's pyplot backend).
"""

from __future__ import annotations

import os
from typing import Any

from shardfuzz.errors import InvalidArgument
from shardfuzz.report.mismatch_map import GlobalView, global_views, grid_dims, pieces_of, sharded_dims

INSTALL = 'pip install "shardfuzz[plot]"'
ERROR_FLOOR = 1e-3  # error/tolerance below this is drawn as this (a log colour scale)


def require_matplotlib(flag: str = "--plot") -> None:
    """A usage error naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidArgument(f"{flag} needs matplotlib, which is not installed: {INSTALL}") from None


def check_path(path: str, flag: str = "--plot") -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"{flag} {path!r}: the folder {folder!r} does not exist")


def plot_mismatch(diffs: list[Any], path: str, output: str | None = None) -> list[str]:
    """Draw the mismatching outputs ``diffs`` (``Mismatch.diffs``; only ``output`` when given) into
    the PNG ``path``; returns the outputs drawn."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [d.name for d in diffs]
    chosen = [d for d in diffs if output is None or d.name == output]
    if not chosen:
        raise InvalidArgument(
            f"--plot-output {output!r} is not a mismatching output of this case; they are {names}"
        )
    fig = Figure(figsize=(13, 3.4 * len(chosen)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(chosen), 3, squeeze=False)
    for row, od in zip(axes, chosen):
        _draw(row, od)
    fig.subplots_adjust(
        left=0.05, right=0.97, bottom=0.3 / len(chosen), top=1 - 0.25 / len(chosen), wspace=0.3, hspace=0.45
    )
    fig.savefig(path, format="png", dpi=90)
    return [d.name for d in chosen]


def _draw(row: Any, od: Any) -> None:
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import MaxNLocator

    pieces = pieces_of(od)
    views = global_views(od, pieces)
    if not views or not od.shape:
        row[0].text(0.5, 0.5, f"{od.name}: nothing to draw (a 0-d or non-tensor value)", ha="center")
        return
    view = next((v for v in views if bool(v.wrong.any())), views[0])
    ref = _real(od.ref)
    actual = _real(view.actual)
    if od.bound is not None:
        err = ((actual - ref).abs() / od.bound.double().clamp_min(1e-300)).nan_to_num(nan=1e300)
    else:  # an exactly compared output: wrong or not
        err = view.wrong.double()
    err = err.clamp(ERROR_FLOOR, 1e300)
    shape = tuple(ref.shape)
    rows, cols = grid_dims(shape, sharded_dims(pieces, shape))
    who = f" (ranks {view.ranks})" if len(views) > 1 else ""
    title = f"{od.name} {od.layout}{who}"
    if rows is None:  # 1-d: lines
        for ax, values, what in ((row[0], ref, "oracle"), (row[1], actual, "result")):
            ax.plot(values.numpy(), marker=".")
            ax.set_title(f"{title}: {what}")
        row[2].semilogy(err.numpy(), marker=".")
        row[2].axhline(1.0, color="red", lw=0.8)
        row[2].set_title(f"{od.name}: error / tolerance (red: 1)")
        for ax in row:
            _cuts(ax, view, None, cols)
            ax.set_xlabel(f"dim {cols}")
        return
    worst = _unravel(int(err.flatten().argmax()), shape)
    at = tuple(slice(None) if d in (rows, cols) else worst[d] for d in range(len(shape)))
    others = [d for d in range(len(shape)) if d not in (rows, cols)]
    where = f" at {', '.join(f'dim {d} = {worst[d]}' for d in others)}" if others else ""
    lo = float(min(ref[at].min(), actual[at].nan_to_num(0.0).min()))
    hi = float(max(ref[at].max(), actual[at].nan_to_num(0.0).max()))
    for ax, values, what in ((row[0], ref, "oracle"), (row[1], actual, "result")):
        im = ax.imshow(values[at].numpy(), aspect="auto", interpolation="nearest", vmin=lo, vmax=hi)
        ax.figure.colorbar(im, ax=ax)
        ax.set_title(f"{title}: {what}{where}")
    folded = err.amax(dim=others) if others else err
    im = row[2].imshow(
        folded.numpy(), aspect="auto", interpolation="nearest", cmap="magma",
        norm=LogNorm(vmin=ERROR_FLOOR, vmax=max(float(folded.max()), 10.0)),
    )  # fmt: skip
    row[2].figure.colorbar(im, ax=row[2], label="error / tolerance")
    what = "error / tolerance" if od.bound is not None else "wrong (compared exactly)"
    row[2].set_title(f"{od.name}: {what}" + (" (max over other dims)" if others else ""))
    for ax in row:
        # min_n_ticks=1: a dim of one element got ticks at -0.5, 0 and 0.5 (fewer than two integer
        # ticks fit, and the locator left integers), which a new user read as half indices
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        _cuts(ax, view, rows, cols)
        ax.set_ylabel(f"dim {rows}")
        ax.set_xlabel(f"dim {cols}")


def _cuts(ax: Any, view: GlobalView, rows: int | None, cols: int) -> None:
    """The shard boundaries: a line where one rank's piece ends."""
    for c in view.cuts[cols]:
        ax.axvline(c - 0.5, color="white" if rows is not None else "grey", lw=1.5, ls="--")
    if rows is not None:
        for c in view.cuts[rows]:
            ax.axhline(c - 0.5, color="white", lw=1.5, ls="--")


def _real(t: Any) -> Any:
    return (t.real if t.is_complex() else t).double()


def _unravel(i: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for s in reversed(shape):
        out.append(i % s)
        i //= s
    return out[::-1]
