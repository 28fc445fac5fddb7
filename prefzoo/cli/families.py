"""The families the atlas and the loss catalogue group losses into, read from what each loss declares (the shapes it
takes, what it needs, its family): one list, so the atlas's overview, its menu and the catalogue's pages agree."""

from __future__ import annotations

from prefzoo.spec import LossSpec
from prefzoo.types import Need, Shape

__all__ = ["GROUPS", "PAPER_FAMILY", "group_of"]

PAPER_FAMILY = "mmpo"  # LossSpec.family of the paper's loss and its ablations: the overview gives them their own panel


def group_of(spec: LossSpec) -> str:
    """The overview panel a loss is drawn in, read from its declared capabilities (first match wins)."""
    if not spec.accepts(Shape.PAIR):
        return "unpaired"
    if Shape.LIST in spec.shapes:
        return "lists"
    if spec.family == PAPER_FAMILY:
        return "MMPO"
    if Need.REFERENCE not in spec.needs:
        return "reference-free"
    if Need.LENGTHS in spec.needs:
        return "length-aware"
    return "DPO-like"


# family -> what its losses have in common (the atlas overview's text under each family's heading)
GROUPS = {
    "DPO-like": r"needs a reference and no lengths: the loss is a function of the log-ratio margin $\Delta$ alone.",
    "length-aware": r"needs a reference and the lengths $\lvert y\rvert$: log-ratios averaged per token (IPO, "
    "sigmoid-norm), a length penalty (R-DPO), or an NLL term normalised by length (combinations with SFT).",
    "reference-free": "no reference model: the scores are the policy's own (average or summed) log-probs.",
    "MMPO": "the paper's loss and its ablations. The listed loss equals $-s_w$ exactly, so `mmpo` (and "
    "`mmpo-no-norm`) draw a **flat line**: $w_w = 1$ and $w_l = 0$ at every margin, plain NLL on the chosen response; "
    r"`mmpo-length-norm` is the same line at $1/\lvert y_w\rvert$. Only `mmpo-no-aux` has the sigmoid weights of "
    "Theorem 3.1.",
    "lists": "losses over K ranked completions, drawn with K = 2 (a pair is a list of two, best first).",
    "unpaired": "one completion at a time, labelled desirable or undesirable: no chosen–rejected margin, so each is "
    "drawn against its implicit reward $\\beta\\rho$ relative to the loss's reference point (KTO's "
    "$\\beta z_0$, BCO's running mean $\\delta$, 0 for `apo-zero-unpaired`), the gradient "
    "$-\\partial L/\\partial\\log\\pi(y)$ of a desirable completion (solid) and of an undesirable one (dashed).",
}
