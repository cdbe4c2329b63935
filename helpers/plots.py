"""One look for every figure in the collection: labelled axes, units, shared colours."""

from __future__ import annotations

import matplotlib.pyplot as plt

STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
plt.rcParams.update(STYLE)


def axes(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.6, **kw):
    """Make a grid of axes sized per panel; return (fig, axes)."""
    fig, ax = plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols, height * nrows),
        squeeze=False,
        constrained_layout=True,
        **kw,
    )
    return fig, (ax[0, 0] if ax.size == 1 else ax.ravel())


def label(ax, xlabel: str, ylabel: str, title: str | None = None, legend: bool = False):
    """Label an axis with units (put them in the strings, e.g. "wall time (s)")."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if legend:
        ax.legend()
    return ax


def curves(
    series: dict,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    ax=None,
    logy: bool = False,
    **plot_kw,
):
    """Plot named (x, y) series on one axis, labelled, with a legend."""
    if ax is None:
        _, ax = axes()
    for name, (x, y) in series.items():
        ax.plot(x, y, label=str(name), **plot_kw)
    if logy:
        ax.set_yscale("log")
    return label(ax, xlabel, ylabel, title, legend=len(series) > 1)


def heatmap(
    values,
    row_labels,
    col_labels,
    ax=None,
    cbar_label: str = "",
    fmt: str = "{:.2f}",
    mark=None,
    mark_text: str = "×",
    **imshow_kw,
):
    """Draw a labelled grid of numbers; cells where `mark` is True get `mark_text` instead."""
    import numpy as np

    if ax is None:
        _, ax = axes(width=1.0 + 0.9 * len(col_labels), height=0.8 + 0.45 * len(row_labels))
    values = np.asarray(values, dtype=float)
    im = ax.imshow(np.ma.masked_invalid(values), aspect="auto", **imshow_kw)
    ax.figure.colorbar(im, ax=ax, label=cbar_label)
    ax.set_xticks(range(len(col_labels)), [str(c) for c in col_labels])
    ax.set_yticks(range(len(row_labels)), [str(r) for r in row_labels])
    ax.grid(False)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            marked = mark is not None and bool(np.asarray(mark)[i, j])
            text = (
                mark_text
                if marked
                else ("" if not np.isfinite(values[i, j]) else fmt.format(values[i, j]))
            )
            ax.text(
                j, i, text, ha="center", va="center", fontsize=8, color="red" if marked else "white"
            )
    return ax
