"""`prefzoo inspect NAME`: a loss's gradient fingerprint computed by autograd.

For a single pair with log π(y_w) − log π(y_l) = m swept over a grid (reference
log-probs held equal, so the DPO log-ratio margin Δ equals m), report
w_w = −∂L/∂log π(y_w) and w_l = −∂L/∂log π(y_l): how hard the loss pushes each
response's likelihood up (positive) or down (negative).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

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
    p.add_argument("name", help="a registered loss name or a combination such as '0.8*dpo + 0.2*sft'")
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
    p.add_argument("--plot", metavar="PNG", help="also write a plot of w_w and w_l to this PNG (needs matplotlib)")
    return p


@dataclass(frozen=True)
class Fingerprint:
    margins: list[float]  # m = log π(y_w) − log π(y_l)
    score_margins: list[float]  # chosen_rewards − rejected_rewards, the loss's own scores
    w_w: list[float]  # −∂L/∂log π(y_w)
    w_l: list[float]  # −∂L/∂log π(y_l)


def _pair(
    m: float, logp: float, ref_logp: float, length: int, rejected_length: int | None = None, score_gap: float = 2.0
) -> tuple[PreferenceBatch, torch.Tensor, torch.Tensor]:
    """One pair; token-level inputs spread each summed log-prob evenly over its tokens (so gradients reach it)."""
    f64 = torch.float64
    n_l = rejected_length or length
    pw = torch.tensor([logp + m / 2], dtype=f64, requires_grad=True)
    pl = torch.tensor([logp - m / 2], dtype=f64, requires_grad=True)

    def tokens(total: float | torch.Tensor, n: int) -> torch.Tensor:
        return (total / n) * torch.ones(1, n, dtype=f64)  # (1, n)

    return PreferenceBatch(
        policy_chosen_logps=pw,
        policy_rejected_logps=pl,
        ref_chosen_logps=torch.tensor([ref_logp], dtype=f64),
        ref_rejected_logps=torch.tensor([ref_logp], dtype=f64),
        chosen_lengths=torch.tensor([length]),
        rejected_lengths=torch.tensor([n_l]),
        policy_chosen_token_logps=tokens(pw, length),
        policy_rejected_token_logps=tokens(pl, n_l),
        chosen_token_entropies=torch.ones(1, length, dtype=f64),
        rejected_token_entropies=torch.ones(1, n_l, dtype=f64),
        chosen_mask=torch.ones(1, length, dtype=torch.bool),
        rejected_mask=torch.ones(1, n_l, dtype=torch.bool),
        ref_chosen_token_logps=tokens(ref_logp, length),
        ref_rejected_token_logps=tokens(ref_logp, n_l),
        chosen_token_log_sq_probs=tokens(2 * logp, length),  # a distribution as peaked as the token: Σπ² = π(y_t)²
        rejected_token_log_sq_probs=tokens(2 * logp, n_l),
        chosen_scores=torch.tensor([score_gap], dtype=f64),
        rejected_scores=torch.tensor([0.0], dtype=f64),
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
    """w_w and w_l by autograd at each margin, one pair at a time (so batch coupling plays no part)."""
    sm, ww, wl = [], [], []
    for m in margins:
        batch, pw, pl = _pair(m, logp, ref_logp, length, rejected_length, score_gap)
        out = loss(batch)
        gw, gl = torch.autograd.grad(out.losses.sum(), (pw, pl), allow_unused=True)
        ww.append(-(gw.item() if gw is not None else 0.0))
        wl.append(-(gl.item() if gl is not None else 0.0))
        sm.append((out.chosen_rewards - out.rejected_rewards).item())
    return Fingerprint(list(margins), sm, ww, wl)


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


def run(args: argparse.Namespace) -> int:
    if args.points < 2 or args.min >= args.max:
        raise CLIError("--points must be >= 2 and --min < --max")
    if args.length < 1 or args.rejected_length < 1:
        raise CLIError("--length and --rejected-length must be positive token counts")
    if args.modifier and args.score_gap <= 0:
        raise CLIError("--score-gap must be > 0 (ODPO's offset is α·log of it)")
    loss = get_loss(args.name, modifiers=args.modifier, **parse_loss_params(args.name, args.loss_param))
    step = (args.max - args.min) / (args.points - 1)
    margins = [args.min + i * step for i in range(args.points)]
    if args.k != 2:
        if args.k < 2 or Shape.LIST not in loss.spec.shapes:
            raise CLIError(f"--k {args.k}: needs K >= 2 and a list loss ({loss.name!r} takes pairs)")
        return _run_list(loss, args, margins)
    fp = fingerprint(loss, margins, args.logp, args.ref_logp, args.length, args.rejected_length, args.score_gap)
    print(f"{loss.name}: {loss.spec.formula}")
    print(f"params: {loss.params}; |y_w| = {args.length}, |y_l| = {args.rejected_length}")
    print("w_w = −∂L/∂log π(y_w),  w_l = −∂L/∂log π(y_l)  (positive raises that response's likelihood)\n")
    rows = [
        [f"{m:+.3f}", f"{s:+.5g}", f"{w:+.6g}", f"{l:+.6g}"]
        for m, s, w, l in zip(fp.margins, fp.score_margins, fp.w_w, fp.w_l, strict=True)
    ]
    print(format_table(rows, ["log π_w − log π_l", "score margin", "w_w", "w_l"]))
    print("\n" + summary(fp))
    if args.plot:
        _plot(loss, args, fp)
        print(f"plot written to {args.plot}")
    return 0


def _plot(loss: Loss, args: argparse.Namespace, fp: Fingerprint) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise CLIError("--plot needs matplotlib: pip install matplotlib (or prefzoo[dev])") from e
    dense = [args.min + i * (args.max - args.min) / 200 for i in range(201)]
    d = fingerprint(loss, dense, args.logp, args.ref_logp, args.length, args.rejected_length, args.score_gap)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(d.margins, d.w_w, label="w_w = −∂L/∂log π(y_w)")
    ax.plot(d.margins, d.w_l, label="w_l = −∂L/∂log π(y_l)", linestyle="--")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("log π(y_w) − log π(y_l)")
    ax.set_ylabel("gradient weight")
    ax.set_title(f"{loss.name}: gradient fingerprint")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    plt.close(fig)
