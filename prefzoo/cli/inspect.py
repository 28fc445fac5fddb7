"""`prefzoo inspect NAME`: a loss's gradient fingerprint computed by autograd.

For a single pair with log π(y_w) − log π(y_l) = m swept over a grid (reference
log-probs held equal, so the DPO log-ratio margin Δ equals m), report
w_w = −∂L/∂log π(y_w) and w_l = −∂L/∂log π(y_l): how hard the loss pushes each
response's likelihood up (positive) or down (negative).
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from prefzoo.cli.losses import format_table
from prefzoo.cli.main import CLIError
from prefzoo.registry import get_loss, parse_loss_params
from prefzoo.spec import Loss
from prefzoo.types import GroupBatch, PreferenceBatch, Shape


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "inspect",
        help="gradient fingerprint of a loss: -dL/dlogπ(y_w), -dL/dlogπ(y_l) against the margin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="+", metavar="NAME",
                   help="a registered loss name or a combination such as '0.8*dpo + 0.2*sft'; several names print "
                   "one table each and --plot overlays them (--loss-param then applies to every one)")
    p.add_argument("--loss-param", "--param", dest="loss_param", action="append", default=[], metavar="KEY=VALUE",
                   help="loss parameter, repeatable, e.g. beta=0.1 (default: the loss's defaults)")  # fmt: skip
    p.add_argument("--min", type=float, default=-10.0, help="smallest margin m = log π(y_w) − log π(y_l) (default -10)")
    p.add_argument("--max", type=float, default=10.0, help="largest margin (default 10)")
    p.add_argument("--points", type=int, default=11, help="grid points in the table (default 11)")
    p.add_argument("--logp", type=float, default=-20.0, help="log π of both responses at m = 0 (default -20)")
    p.add_argument("--ref-logp", type=float, default=-20.0, help="log π_ref of both responses (default -20)")
    p.add_argument("--k", type=int, default=2, metavar="K",
                   help="list losses: K completions per group, ranked best first and spread by the margin "
                   "(log π of rank j is logp + m·((K−1)/2 − j)/(K−1)); prints −∂L/∂log π of every rank (default 2)")
    p.add_argument("--length", type=int, default=10, help="completion length of the chosen response (default 10)")
    p.add_argument("--rejected-length", type=int, default=15,
                   help="completion length of the rejected response (default 15: longer, as length-sensitive losses "
                   "and LD-DPO see it)")  # fmt: skip
    p.add_argument("--modifier", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                   help="a loss modifier, repeatable, applied in order, e.g. ld-dpo:alpha=0.5 (default: none)")
    p.add_argument("--score-gap", type=float, default=2.0,
                   help="data score of y_w minus that of y_l, for modifiers that read scores (odpo) (default 2)")
    p.add_argument("--plot", metavar="PNG",
                   help="also write a plot of w_w and w_l to this file, every NAME overlaid; .svg or .pdf by suffix "
                   "(needs matplotlib)")
    return p


@dataclass(frozen=True)
class Fingerprint:
    margins: list[float]  # m = log π(y_w) − log π(y_l)
    score_margins: list[float]  # chosen_rewards − rejected_rewards, the loss's own scores
    w_w: list[float]  # −∂L/∂log π(y_w)
    w_l: list[float]  # −∂L/∂log π(y_l)


def _pair(
    m: float | list[float], logp: float, ref_logp: float, length: int, rejected_length: int | None = None,
    score_gap: float = 2.0,
) -> tuple[PreferenceBatch, torch.Tensor, torch.Tensor]:
    """One pair per margin; token-level inputs spread each summed log-prob evenly over its tokens (so gradients
    reach it)."""
    f64 = torch.float64
    ms = torch.tensor([m] if isinstance(m, float | int) else m, dtype=f64)  # (B,)
    b = ms.numel()
    n_l = rejected_length or length
    pw = (logp + ms / 2).requires_grad_()  # (B,)
    pl = (logp - ms / 2).requires_grad_()

    def tokens(total: float | torch.Tensor, n: int) -> torch.Tensor:
        return (torch.as_tensor(total, dtype=f64).reshape(-1, 1) / n).expand(b, n)  # (B, n)

    def full(x: float, n: int | None = None, dtype: torch.dtype = f64) -> torch.Tensor:
        return torch.full((b,) if n is None else (b, n), x, dtype=dtype)

    return PreferenceBatch(
        policy_chosen_logps=pw,
        policy_rejected_logps=pl,
        ref_chosen_logps=full(ref_logp),
        ref_rejected_logps=full(ref_logp),
        chosen_lengths=torch.full((b,), length),
        rejected_lengths=torch.full((b,), n_l),
        policy_chosen_token_logps=tokens(pw, length),
        policy_rejected_token_logps=tokens(pl, n_l),
        chosen_token_entropies=full(1.0, length),
        rejected_token_entropies=full(1.0, n_l),
        chosen_mask=torch.ones(b, length, dtype=torch.bool),
        rejected_mask=torch.ones(b, n_l, dtype=torch.bool),
        ref_chosen_token_logps=tokens(ref_logp, length),
        ref_rejected_token_logps=tokens(ref_logp, n_l),
        chosen_token_log_sq_probs=tokens(2 * logp, length),  # a distribution as peaked as the token: Σπ² = π(y_t)²
        rejected_token_log_sq_probs=tokens(2 * logp, n_l),
        chosen_scores=full(score_gap),
        rejected_scores=full(0.0),
    ), pw, pl


def fingerprint(
    loss: Loss,
    margins: list[float],
    logp: float = -20.0,
    ref_logp: float = -20.0,
    length: int = 10,
    rejected_length: int | None = None,
    score_gap: float = 2.0,
) -> Fingerprint:
    """w_w and w_l by autograd at each margin, each pair on its own: batch coupling plays no part.

    A loss that is not batch-coupled sees every margin in one batch (its per-pair losses are independent, so
    ∂ΣL/∂log π of a pair is that pair's own gradient); a batch-coupled one sees one pair at a time.
    """
    groups = [list(margins)] if not loss.batch_coupled else [[m] for m in margins]
    sm: list[float] = []
    ww: list[float] = []
    wl: list[float] = []
    for ms in groups:
        batch, pw, pl = _pair(ms, logp, ref_logp, length, rejected_length, score_gap)
        out = loss(batch)
        gw, gl = torch.autograd.grad(out.losses.sum(), (pw, pl), allow_unused=True)
        ww += (-gw).tolist() if gw is not None else [0.0] * len(ms)
        wl += (-gl).tolist() if gl is not None else [0.0] * len(ms)
        sm += (out.chosen_rewards - out.rejected_rewards).tolist()
    return Fingerprint(list(margins), sm, [w + 0.0 for w in ww], [w + 0.0 for w in wl])  # + 0.0: no −0.0


def summary(fp: Fingerprint) -> str:
    """One sentence naming what the numbers show, e.g. that the gradient is plain NLL on y_w."""
    tol = 1e-9
    const_w = max(fp.w_w) - min(fp.w_w) < tol
    zero_l = max(abs(x) for x in fp.w_l) < tol
    if const_w and zero_l:
        return (
            f"w_w = {fp.w_w[0]:g} and w_l = 0 at every margin: the gradient is {fp.w_w[0]:g}·∇log π(y_w|x), "
            "plain NLL on the chosen response; the rejected response and the margin play no part."
        )
    if max(abs(w + l - 1.0) for w, l in zip(fp.w_w, fp.w_l, strict=True)) < 1e-6:
        return (
            "w_w + w_l = 1 at every margin: the weights are σ(s_w − s_l) and σ(s_l − s_w) of Theorem 3.1; both "
            "likelihoods rise, the higher-scoring response's more."
        )
    if all(w >= -tol for w in fp.w_w) and all(w >= -tol for w in fp.w_l):
        return "Both weights are non-negative: the loss raises the likelihood of both responses."
    if all(w >= -tol for w in fp.w_w) and all(w <= tol for w in fp.w_l):
        return "w_w >= 0 >= w_l: the loss raises y_w and lowers y_l, by amounts that depend on the margin."
    return "The signs of w_w and w_l change with the margin: the loss is not monotone in the two likelihoods."


def list_weights(loss: Loss, k: int, margin: float, logp: float = -20.0, ref_logp: float = -20.0,
                 length: int = 10) -> list[float]:
    """−∂L/∂log π(z_j) for ranks j = 1..K of one group whose log-probs fall evenly by ``margin`` from best to worst."""
    f64 = torch.float64
    spread = torch.tensor([((k - 1) / 2 - j) / (k - 1) for j in range(k)], dtype=f64)
    pol = (logp + margin * spread)[None].requires_grad_()
    batch = GroupBatch(policy_logps=pol, ref_logps=torch.full((1, k), ref_logp, dtype=f64),
                       lengths=torch.full((1, k), length))
    (g,) = torch.autograd.grad(loss(batch).losses.sum(), pol)
    return [-x for x in g[0].tolist()]


def list_summary(rows: list[list[float]]) -> str:
    """What the per-rank weights show, e.g. mmpo-list's NLL on the best plus a zero-sum ranking of the rest."""
    tol = 1e-9
    best = [r[0] for r in rows]
    rest_sums = [sum(r[1:]) for r in rows]
    if max(best) - min(best) < tol and max(abs(x) for x in rest_sums) < 1e-6:
        return (f"w_1 = {best[0]:g} at every margin: NLL on the best completion; the other ranks' weights sum to 0, "
                "a Plackett–Luce ranking of the rest that does not involve the best (docs/theory.md).")
    if all(abs(sum(r) - 1.0) < 1e-6 and min(r) >= -tol for r in rows):
        return "The weights are a softmax over the group (sum 1, all ≥ 0): Theorem 3.1 with n = K samples."
    return "Per-rank weights against the margin; positive raises that completion's likelihood."


def _run_list(loss: Loss, args: argparse.Namespace, margins: list[float]) -> int:
    rows = [list_weights(loss, args.k, m, args.logp, args.ref_logp, args.length) for m in margins]
    print(f"{loss.name}: {loss.spec.formula}")
    print(f"params: {loss.params}")
    print(f"w_j = −∂L/∂log π(z_j) for K = {args.k} completions ranked best (j = 1) first; the margin m is "
          "log π(z_1) − log π(z_K)\n")
    table = [[f"{m:+.3f}", *(f"{w:+.6g}" for w in r)] for m, r in zip(margins, rows, strict=True)]
    print(format_table(table, ["m", *(f"w_{j + 1}" for j in range(args.k))]))
    print("\n" + list_summary(rows))
    return 0


def sign_changes(margins: list[float], w: list[float], tol: float) -> list[float]:
    """Margins where ``w`` crosses zero between two points at least ``tol`` away from it (linear interpolation)."""
    big = [i for i, x in enumerate(w) if abs(x) > tol]
    out = []
    for i, j in itertools.pairwise(big):
        if (w[i] > 0) != (w[j] > 0):
            k = next(k for k in range(i, j) if (w[k] > 0) != (w[k + 1] > 0) or w[k + 1] == 0)
            a, b = w[k], w[k + 1]
            out.append(margins[k] + (margins[k + 1] - margins[k]) * (a / (a - b) if a != b else 0.0))
    return out


def _plateau(margins: list[float], w: list[float], tol: float, from_high: bool) -> float | None:
    """The margin beyond which ``w`` stays within ``tol`` of its value at that end of the grid, if that stretch
    covers at least a tenth of the grid (else None)."""
    idx = list(range(len(w)))[::-1] if from_high else list(range(len(w)))
    end = w[idx[0]]
    last = idx[0]
    for i in idx[1:]:
        if abs(w[i] - end) > tol:
            break
        last = i
    span = margins[-1] - margins[0]
    return margins[last] if abs(margins[last] - margins[idx[0]]) >= 0.1 * span else None


def number(x: float) -> str:
    """A weight for text: 4 significant digits with its sign, and 0 for rounding noise (|x| < 5e-13)."""
    return f"{x:+.4g}" if abs(x) >= 5e-13 else "0"


def landmarks(fp: Fingerprint, rel: float = 0.01) -> list[str]:
    """Where w_w and w_l change sign or saturate on the fingerprint's grid, one sentence each.

    Saturation: from an end of the grid on, over at least a tenth of it, a weight stays within ``rel`` × the largest
    |weight| of its value at that end; "vanishes" when that value is 0 (the loss stops pushing), else it "saturates"
    (the loss keeps pushing at that rate however far the margin goes).
    """
    scale = max(abs(x) for x in (*fp.w_w, *fp.w_l))
    if scale == 0.0:
        return ["w_w = w_l = 0 on the whole grid: the loss does not depend on these log-probs"]
    tol = rel * scale
    out = []
    for label, w in (("w_w", fp.w_w), ("w_l", fp.w_l)):
        if max(w) - min(w) <= tol:
            out.append(f"{label} is constant on the grid ({number(w[0])})")
            continue
        out += [f"{label} changes sign at m ≈ {x:+.3g}" for x in sign_changes(fp.margins, w, tol)]
        for from_high, cmp in ((False, "≤"), (True, "≥")):
            m = _plateau(fp.margins, w, tol, from_high)
            if m is None:
                continue
            end = w[-1] if from_high else w[0]
            if abs(end) <= tol:
                out.append(f"{label} vanishes (|{label}| < {rel:g}·max) for m {cmp} {m:+.3g}")
            else:
                out.append(f"{label} saturates at {number(end)} for m {cmp} {m:+.3g}")
    return out


def dense_grid(lo: float, hi: float, points: int = 201) -> list[float]:
    return [lo + i * (hi - lo) / (points - 1) for i in range(points)]


def run(args: argparse.Namespace) -> int:
    if args.points < 2 or args.min >= args.max:
        raise CLIError("--points must be >= 2 and --min < --max")
    if args.length < 1 or args.rejected_length < 1:
        raise CLIError("--length and --rejected-length must be positive token counts")
    if args.modifier and args.score_gap <= 0:
        raise CLIError("--score-gap must be > 0 (ODPO's offset is α·log of it)")
    losses = [get_loss(n, modifiers=args.modifier, **parse_loss_params(n, args.loss_param)) for n in args.names]
    step = (args.max - args.min) / (args.points - 1)
    margins = [args.min + i * step for i in range(args.points)]
    if args.k != 2:
        for loss in losses:
            if args.k < 2 or Shape.LIST not in loss.spec.shapes:
                raise CLIError(f"--k {args.k}: needs K >= 2 and a list loss ({loss.name!r} takes pairs)")
        if args.plot:
            raise CLIError("--plot draws pairs (K = 2): leave out --k")
        for i, loss in enumerate(losses):
            print("\n" * (i > 0), end="")
            _run_list(loss, args, margins)
        return 0
    for loss in losses:
        if not loss.spec.accepts(Shape.PAIR):
            raise CLIError(f"{loss.name!r} takes unpaired completions, not pairs: it has no margin to sweep")
    dense = dense_grid(args.min, args.max)
    curves = []
    for i, loss in enumerate(losses):
        fp = fingerprint(loss, margins, args.logp, args.ref_logp, args.length, args.rejected_length, args.score_gap)
        d = fingerprint(loss, dense, args.logp, args.ref_logp, args.length, args.rejected_length, args.score_gap)
        curves.append((loss.name, d))
        print("\n" * (i > 0), end="")
        print(f"{loss.name}: {loss.spec.formula}")
        print(f"params: {loss.params}; |y_w| = {args.length}, |y_l| = {args.rejected_length}")
        print("w_w = −∂L/∂log π(y_w),  w_l = −∂L/∂log π(y_l)  (positive raises that response's likelihood)\n")
        rows = [
            [f"{m:+.3f}", f"{s:+.5g}", f"{w:+.6g}", f"{l:+.6g}"]
            for m, s, w, l in zip(fp.margins, fp.score_margins, fp.w_w, fp.w_l, strict=True)
        ]
        print(format_table(rows, ["log π_w − log π_l", "score margin", "w_w", "w_l"]))
        print("\n" + summary(fp))
        marks = landmarks(d)
        print(f"on [{args.min:g}, {args.max:g}]: " + ("; ".join(marks) if marks else "no sign change or saturation"))
    if args.plot:
        title = f"{losses[0].name}: gradient fingerprint" if len(losses) == 1 else "gradient fingerprints"
        save_plot(curves, [args.plot], title)
        print(f"plot written to {args.plot}")
    return 0


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a one-line CLIError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise CLIError("--plot needs matplotlib: pip install matplotlib (or prefzoo[dev])") from e
    return plt


def draw(ax: Any, curves: list[tuple[str, Fingerprint]], legend: bool = True) -> None:
    """w_w (solid) and w_l (dashed) of each labelled fingerprint on ``ax``, one colour per curve."""
    for i, (label, fp) in enumerate(curves):
        color = f"C{i % 10}"
        one = len(curves) == 1
        ax.plot(fp.margins, fp.w_w, color=color, label="w_w = −∂L/∂log π(y_w)" if one else f"{label}: w_w")
        ax.plot(fp.margins, fp.w_l, color=color, linestyle="--",
                label="w_l = −∂L/∂log π(y_l)" if one else f"{label}: w_l")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("log π(y_w) − log π(y_l)")
    ax.set_ylabel("gradient weight")
    if legend:
        ax.legend(fontsize="small" if len(curves) > 2 else None)


def save_plot(curves: list[tuple[str, Fingerprint]], paths: list[str], title: str, dpi: int = 120) -> None:
    """One figure of the overlaid fingerprints, written to every path (the format follows each suffix)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5) if len(curves) == 1 else (7, 4.5))
    draw(ax, curves)
    ax.set_title(title)
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=dpi, metadata={"Software": None} if str(path).endswith(".png") else {"Date": None})
    plt.close(fig)
