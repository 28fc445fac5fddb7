"""The atlas's figures, drawn to be read at page width: small multiples with their own y-scales, the Okabe–Ito
colour-blind-safe palette, labelled axes, legends outside the data, an SVG for the page and a PNG at 2× beside it.

Each figure takes the data :mod:`prefzoo.cli.atlas` computed; nothing here computes a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefzoo.cli.inspect import Fingerprint, pyplot

# Okabe & Ito (2008), "Color Universal Design": distinct under the common colour-vision deficiencies
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
PNG_DPI = 192  # 2 × 96 dpi: the PNG has twice the pixels of the figure at its size on the page
COLUMNS = 3  # small multiples per row: each panel ~2.7 in wide on a figure of page width (8 in)
PAGE_WIDTH = 8.0  # inches: a figure this wide shows at ~0.9 × its size in the docs' content column
MARGIN_LABEL = "margin m = log π(y_w) − log π(y_l)"
W_W_LABEL = "w_w = −∂L/∂log π(y_w)"
W_L_LABEL = "w_l = −∂L/∂log π(y_l)"
REWARD_LABEL = "implicit reward − reference point"
WEIGHT_LABEL = "−∂L/∂log π(y)"
NOISE = 1e-12  # |weight| below this is float rounding of an exact 0 (mmpo's w_l is ±1.5e-15): drawn as 0


def exact(values: Sequence[float]) -> list[float]:
    """``values`` with float rounding of zero drawn as 0: otherwise matplotlib scales the axis to ±1e-15 and plots
    the noise as a wild zig-zag beside a text that says the weight is 0."""
    return [0.0 if abs(v) < NOISE else float(v) for v in values]


def _style(plt: Any) -> None:
    plt.rcParams.update({
        "svg.hashsalt": "prefzoo-atlas",  # stable ids: regenerating unchanged plots changes no bytes
        "font.size": 9,
        "axes.titlesize": 9,
        "axes.labelsize": 9,
        "legend.fontsize": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.color": "#e4e4e4",
        "grid.linewidth": 0.6,
    })


def save(fig: Any, img: Path, stem: str) -> None:
    """``img/stem.svg`` and ``img/stem.png`` (2×), without timestamps so that unchanged figures keep their bytes."""
    plt = pyplot()
    fig.savefig(img / f"{stem}.png", dpi=PNG_DPI, metadata={"Software": None}, bbox_inches="tight")
    fig.savefig(img / f"{stem}.svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)


def _zero(ax: Any) -> None:
    ax.axhline(0, color="#333333", linewidth=0.8, zorder=1.5)


def two_panels(series: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float]]], title: str,
               x_label: str, left: str, right: str) -> Any:
    """One figure, two panels side by side (left: the first weight, right: the second), one colour per series
    ``(label, x, left values, right values)``; the legend below both panels."""
    plt = pyplot()
    _style(plt)
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.2), sharex=True, layout="constrained")
    for i, (label, x, a, b) in enumerate(series):
        color = OKABE_ITO[i % len(OKABE_ITO)]
        axes[0].plot(x, exact(a), color=color, linewidth=1.6, label=label)
        axes[1].plot(x, exact(b), color=color, linewidth=1.6)
    for ax, name in zip(axes, (left, right), strict=True):
        _zero(ax)
        ax.set_title(name)
        ax.set_xlabel(x_label)
    axes[0].set_ylabel("gradient weight")
    fig.suptitle(title, fontsize=10)
    fig.legend(loc="outside lower center", ncol=min(len(series), 3), frameon=False)
    return fig


def fingerprint_figure(name: str, curves: Sequence[tuple[str, Fingerprint]]) -> Any:
    """A loss's page figure: w_w and w_l against the margin, one colour per parameter value."""
    return two_panels([(label, fp.margins, fp.w_w, fp.w_l) for label, fp in curves],
                      f"{name}: gradient fingerprint", MARGIN_LABEL, W_W_LABEL, W_L_LABEL)


def small_multiples(panels: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float]]], title: str,
                    x_label: str, first: str, second: str) -> Any:
    """One small panel per loss ``(name, x, first weight, second weight)``, each with its own y-scale and a zero line;
    the first weight solid blue, the second dashed vermillion; one legend below the panels."""
    plt = pyplot()
    _style(plt)
    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(PAGE_WIDTH, 0.7 + 1.85 * rows), sharex=True, squeeze=False,
                             layout="constrained")
    for k, ax in enumerate(axes.flat):
        if k >= len(panels):
            ax.set_visible(False)
            continue
        name, x, a, b = panels[k]
        _zero(ax)
        ax.plot(x, exact(a), color=OKABE_ITO[0], linewidth=1.5, label=first)
        ax.plot(x, exact(b), color=OKABE_ITO[1], linewidth=1.5, linestyle="--", label=second)
        ax.set_title(name, fontweight="bold")
        ax.tick_params(labelsize=8)
        if k % COLUMNS == 0:
            ax.set_ylabel("weight")
    for ax in axes[-1]:
        ax.set_xlabel(x_label)
    for k in range(len(panels), rows * COLUMNS):  # an empty slot in the last row: label the panel above it
        if k - COLUMNS >= 0:
            axes.flat[k - COLUMNS].tick_params(labelbottom=True)
            axes.flat[k - COLUMNS].set_xlabel(x_label)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(title, fontsize=10)
    fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False)
    return fig
