"""`prefzoo atlas OUT_DIR`: the loss atlas, one Markdown page per registered loss plus an overview, with plots.

Each page is generated from the registry (formula, parameters, paper, capabilities, the conformance properties that
cover the loss) and from the loss itself: its gradient fingerprint (:func:`prefzoo.cli.inspect.fingerprint`, by
autograd) at the default parameters and at two other values of its main parameter, as a table of numbers, the
sign changes and saturations :func:`prefzoo.cli.inspect.landmarks` finds, and a PNG + SVG plot.  docs/atlas/ is
this command's output for the built-in losses (``--builtin-only``); a test regenerates the pages' text and fails
when it drifts from the registry.  Installed plugins' losses are included unless ``--builtin-only``.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from prefzoo.cli import atlas_plots
from prefzoo.cli.inspect import Fingerprint, dense_grid, fingerprint, landmarks, number, pyplot, summary
from prefzoo.cli.losses import coupling, formula_markdown, paper_links, source_of, takes
from prefzoo.cli.main import CLIError
from prefzoo.cli.modifiers import transforms_markdown
from prefzoo.registry import MODIFIERS, get_registry, modify, registry_of
from prefzoo.spec import Loss, LossParamError, LossSpec, ModifierSpec, ParamInfo, param_infos
from prefzoo.types import Need, Shape, UnpairedBatch

MARGIN_MIN, MARGIN_MAX, POINTS = -50.0, 50.0, 51  # the margin grid: wide enough for β = 0.1 to saturate σ(βΔ)
LOGP = -30.0  # log π of both responses (and of the reference) at margin 0: log π(y_w) = −5 at the widest margin
LENGTH, REJECTED_LENGTH = 10, 15  # |y_w|, |y_l|: the rejected response longer, as `prefzoo inspect` does by default
TABLE_MARGINS = (-50.0, -20.0, -4.0, 0.0, 4.0, 20.0, 50.0)  # the margins whose weights each page prints
# unpaired losses: the implicit reward relative to the loss's reference point (its chosen − rejected rewards), and
# the mean log-ratio of the batch's completions and of its mismatched (KL) ones, which sets KTO's z₀ and BCO's δ
REWARD_MIN, REWARD_MAX, REWARD_POINTS = -10.0, 10.0, 81
REWARD_TABLE = (-10.0, -4.0, -1.0, 0.0, 1.0, 4.0, 10.0)
REFERENCE_LOGRATIO = 2.0
# the loss each modifier is drawn on: the first of these it applies to (documentation data, as in cli/features.py)
MODIFIER_BASES = ("dpo", "simpo")
PAPER_FAMILY = "mmpo"  # LossSpec.family of the paper's loss and its ablations: the overview gives them their own panel
# the pages' recurring math, in LaTeX (arithmatex: $...$ inline)
W_W = r"$w_w = -\partial L/\partial\log\pi(y_w)$"
W_L = r"$w_l = -\partial L/\partial\log\pi(y_l)$"
MARGIN = r"$m = \log\pi(y_w) - \log\pi(y_l)$"
LENGTHS = rf"$\lvert y_w\rvert = {LENGTH}$, $\lvert y_l\rvert = {REJECTED_LENGTH}$"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "atlas",
        help="write the loss atlas (one Markdown page per loss with its gradient fingerprint, plus an overview)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder for the pages; images go to OUT_DIR/img")
    p.add_argument("--builtin-only", action="store_true",
                   help="only the losses shipped with prefzoo (how docs/atlas is generated)")
    p.add_argument("--no-images", action="store_true", help="write the pages only (no matplotlib needed)")
    return p


@dataclass(frozen=True)
class Curve:
    """The fingerprint of one loss at one setting of its main parameter."""

    label: str  # e.g. "beta = 0.1 (default)"
    fp: Fingerprint


def main_param(spec: LossSpec) -> ParamInfo | None:
    """The parameter the atlas sweeps: ``beta`` if the loss has one, else its first numeric parameter."""
    infos = [i for i in param_infos(spec.params_cls) if i.type in (float, int) and i.choices is None]
    return next((i for i in infos if i.name == "beta"), infos[0] if infos else None)


def sweep_values(spec: LossSpec, info: ParamInfo) -> list[float]:
    """The default and two other valid values of ``info``: ÷4 and ×4 where the range allows, else ÷2 / ×2, ..."""
    d = info.default
    if d == 0:
        candidates = [0.5, 2.0, -0.5, 1.0]
    else:
        candidates = [d / 4, d * 4, d / 2, d * 2, d / 10, d * 10, -d]
    out: list[float] = []
    for v in candidates:
        v = float(v) if info.type is float else int(v)
        if v == d or v in out or info.check(v) is not None:
            continue
        try:
            spec.params(**{info.name: v})
        except LossParamError:
            continue
        out.append(v)
        if len(out) == 2:
            break
    return [d, *sorted(out)]


def curves_of(spec: LossSpec) -> list[Curve]:
    """The fingerprints a page shows: default parameters first, then the two other values of the main parameter."""
    if not spec.accepts(Shape.PAIR):
        return []
    grid = dense_grid(MARGIN_MIN, MARGIN_MAX, POINTS)
    info = main_param(spec)
    settings: list[tuple[str, dict[str, float]]] = [("defaults", {})]
    if info is not None:
        vals = sweep_values(spec, info)
        settings = [(f"{info.name} = {vals[0]:g} (default)", {})]
        settings += [(f"{info.name} = {v:g}", {info.name: v}) for v in vals[1:]]
    return [Curve(label, fingerprint(Loss(spec, spec.params(**kw)), grid, LOGP, LOGP, LENGTH, REJECTED_LENGTH))
            for label, kw in settings]


@dataclass(frozen=True)
class UnpairedCurve:
    """The gradient of an unpaired loss per completion, against its implicit reward relative to the reference point."""

    label: str  # e.g. "beta = 0.1 (default)"
    rewards: list[float]  # chosen_rewards − rejected_rewards: β·ρ less the point it is compared with (β·z₀, δ, 0)
    desirable: list[float]  # −∂L/∂log π(y) of a desirable completion at that reward
    undesirable: list[float]  # −∂L/∂log π(y) of an undesirable one


def unpaired_gradient(loss: Loss, label: str) -> UnpairedCurve:
    """−∂L/∂log π(y) by autograd for completions whose implicit rewards lie evenly on [REWARD_MIN, REWARD_MAX] about
    the loss's reference point, read back from its output (``chosen_rewards − rejected_rewards``). The mismatched
    completions' mean log-ratio is :data:`REFERENCE_LOGRATIO` (KTO's z₀); the batch's rewards are symmetric about the
    point, so BCO's running mean δ after this one batch is the point itself. Each completion's loss depends on the
    others only through that constant point, so one batch gives every completion's own gradient."""
    beta = float(getattr(loss.params, "beta", 1.0))
    xs = torch.tensor(dense_grid(REWARD_MIN, REWARD_MAX, REWARD_POINTS), dtype=torch.float64)  # (N,)

    def run(rho: torch.Tensor, desirable: bool) -> tuple[list[float], torch.Tensor]:
        n, base = rho.numel(), torch.full((rho.numel(),), LOGP, dtype=torch.float64)
        policy = (base + rho).requires_grad_()
        batch = UnpairedBatch(
            policy_logps=policy, labels=torch.full((n,), desirable), ref_logps=base,
            lengths=torch.full((n,), LENGTH), kl_policy_logps=base + REFERENCE_LOGRATIO, kl_ref_logps=base,
        )
        out = Loss(loss.spec, loss.params)(batch, update_state=True)  # a fresh state: BCO's δ is this batch's mean
        (g,) = torch.autograd.grad(out.losses.sum(), (policy,))
        return [-v + 0.0 for v in g.tolist()], (out.chosen_rewards - out.rejected_rewards).detach()

    _, first = run(REFERENCE_LOGRATIO + xs / beta, True)
    point = float((beta * (REFERENCE_LOGRATIO + xs / beta) - first).mean())  # β·z₀, δ or 0
    rho = (xs + point) / beta  # (N,) rewards β·ρ symmetric about the point
    desirable, rewards = run(rho, True)
    undesirable, _ = run(rho, False)
    return UnpairedCurve(label, [round(r, 9) + 0.0 for r in rewards.tolist()], desirable, undesirable)


def unpaired_curves_of(spec: LossSpec) -> list[UnpairedCurve]:
    """An unpaired loss's gradient at its defaults and at two other values of its main parameter."""
    if not spec.accepts(Shape.UNPAIRED) or spec.accepts(Shape.PAIR):
        return []
    info = main_param(spec)
    settings: list[tuple[str, dict[str, float]]] = [("defaults", {})]
    if info is not None:
        vals = sweep_values(spec, info)
        settings = [(f"{info.name} = {vals[0]:g} (default)", {})]
        settings += [(f"{info.name} = {v:g}", {info.name: v}) for v in vals[1:]]
    return [unpaired_gradient(Loss(spec, spec.params(**kw)), label) for label, kw in settings]


def covering_properties(spec: LossSpec) -> list[str]:
    """The conformance kit's properties checked on this loss (``prefzoo check NAME`` runs them)."""
    try:
        from prefzoo.testing.conformance import ALL_PROPERTIES
    except ImportError as e:  # hypothesis missing
        raise CLIError(f"prefzoo atlas lists the conformance properties: pip install 'prefzoo[testing]' ({e})") from e
    out = []
    for prop in ALL_PROPERTIES:
        if prop.applies_to(spec):
            out.append(f"`{prop.name}`" + (" (for the parameters where declared)" if prop.params_filter and callable(
                spec.monotone if "monotone" in prop.name else spec.batch_coupled) else ""))
    if spec.builtin:
        from prefzoo.testing.reference import REFERENCES

        if spec.name in REFERENCES:
            out.append("`reference` (an independent float64 transcription of the paper's formula)")
    return out


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


def loss_page(spec: LossSpec, curves: list[Curve], unpaired: list[UnpairedCurve] | None = None) -> str:
    """The atlas page of one loss, in Markdown."""
    out = [
        f"# {spec.name}",
        "",
        "<!-- Generated by `prefzoo atlas docs/atlas --builtin-only`; a test fails if it drifts. -->",
        "",
        spec.description,
        "",
        *formula_markdown(spec),
        f"**Scores** (reward accuracy): {spec.scores}",
        "",
    ]
    if spec.notes:
        out += [f"**Note:** {spec.notes}", ""]
    out += [
        f"**Paper:** {paper_links(spec.paper)}. Registered by `{spec.plugin}` ({source_of(spec)}); family "
        f"`{spec.family}`; "
        f"[catalogue entry](../losses.md#{spec.name})." if spec.builtin else
        f"**Paper:** {paper_links(spec.paper)}. Registered by `{spec.plugin}` ({source_of(spec)}); family "
        f"`{spec.family}`.",
        "",
        *_capability_lines(spec),
        "## Parameters",
        "",
    ]
    infos = param_infos(spec.params_cls)
    if infos:
        out += ["| parameter | default | valid | meaning |", "|---|---|---|---|"]
        out += [f"| `{i.name}` | `{i.default!r}` | {i.range_text()} | {i.doc} |" for i in infos]
    else:
        out.append("No parameters.")
    out += ["", "## Properties that cover it", "",
            "The conformance kit (`prefzoo check " + spec.name + "`, [properties](../properties.md)) checks:", ""]
    out += [f"- {p}" for p in covering_properties(spec)]
    out += ["", "## Gradient fingerprint", ""]
    if not curves:
        return "\n".join(out + _unpaired_lines(spec, unpaired or [])).rstrip("\n") + "\n"
    out += [
        f"{W_W} (solid) and {W_L} (dashed) by autograd against the margin {MARGIN}, one pair at a time, "
        f"$\\log\\pi = {LOGP:g} \\pm m/2$, reference log-probs ${LOGP:g}$ (so $\\Delta = m$), {LENGTHS}. Positive "
        "raises that response's likelihood. "
        f"`prefzoo inspect {spec.name} --min {MARGIN_MIN:g} --max {MARGIN_MAX:g} --points {POINTS} --logp {LOGP:g} "
        f"--ref-logp {LOGP:g}` prints the same fingerprint.",
        "",
        f"![{spec.name}: gradient fingerprint, w_w and w_l against the margin](img/{spec.name}.svg)",
        "",
        f"[PNG, 2×](img/{spec.name}.png)",
        "",
    ]
    if Shape.LIST in spec.shapes and Shape.PAIR not in spec.shapes:
        out += ["A list loss: the pair is a group of K = 2, best first (`prefzoo inspect NAME --k K` shows ranks).",
                ""]
    for c in _merge_equal(curves):
        out += _curve_lines(c)
    return "\n".join(out).rstrip("\n") + "\n"


_MATH_RULES: tuple[tuple[str, str], ...] = (  # the CLI's plain-text sentences about weights, as LaTeX for a page
    (r"\(\|(w_[wl])\| < ([\d.]+)·max\)", r"($\\lvert \1\\rvert < \2\\cdot\\max$)"),
    (r"\bm ≤ ([-+]?[\d.]+)", r"$m \\le \1$"),
    (r"\bm ≥ ([-+]?[\d.]+)", r"$m \\ge \1$"),
    (r"\bm ≈ ([-+]?[\d.]+)", r"$m \\approx \1$"),
    (r"w_w >= 0 >= w_l", r"$w_w \\ge 0 \\ge w_l$"),
    (r"w_w \+ w_l = ([\d.]+)", r"$w_w + w_l = \1$"),
    (r"\b(w_[wl]) = ([-+]?[\d.]+(?:e-?\d+)?)", r"$\1 = \2$"),
    (r"σ\((s_[wl]) − (s_[wl])\)", r"$\\sigma(\1 - \2)$"),
    (r"([\d.]+)·∇log π\(y_w\|x\)", r"$\1\\cdot\\nabla\\log\\pi(y_w\\mid x)$"),
    (r"\[(-?\d+), (-?\d+)\]", r"$[\1, \2]$"),
    (r"→ 0", r"$\\to 0$"),
    (r"\blarge m\b", r"large $m$"),
)


def math_text(text: str) -> str:
    """The CLI's sentences about a fingerprint (`prefzoo inspect` prints them as text) with their formulas in LaTeX:
    comparisons, weights, σ and ∇ terms, and the bare symbols w_w, w_l, y_w, y_l."""
    for pattern, repl in (*_MATH_RULES, (r"\b([wy]_[wl])\b", r"$\1$")):
        parts = re.split(r"(\$[^$]*\$)", text)  # each rule only outside the math the rules before it made
        text = "".join(p if p.startswith("$") else re.sub(pattern, repl, p) for p in parts)
    return text


def _merge_equal(curves: list[Curve], rel: float = 1e-9) -> list[Curve]:
    """Settings whose fingerprints agree (to ``rel`` × the largest weight) shown once, under all their labels: MMPO's
    β changes no gradient, and three equal sections would say so three times."""
    groups: list[list[Curve]] = []
    for c in curves:
        for g in groups:
            d = g[0].fp
            scale = max(abs(x) for x in (*d.w_w, *d.w_l, 1e-300))
            pairs = zip((*d.w_w, *d.w_l), (*c.fp.w_w, *c.fp.w_l), strict=True)
            if all(abs(a - b) <= rel * scale for a, b in pairs):
                g.append(c)
                break
        else:
            groups.append([c])
    return [g[0] if len(g) == 1 else
            Curve("; ".join(c.label for c in g) + ": the same gradient", g[0].fp) for g in groups]


def _unpaired_lines(spec: LossSpec, curves: list[UnpairedCurve]) -> list[str]:
    """An unpaired loss's gradient section: what is drawn, the figure, and the weights at a few rewards."""
    if not curves:
        return ["No fingerprint: the loss takes no pairs and no single completions with a reward to sweep."]
    out = [
        "An unpaired loss sees one completion at a time, with a desirable/undesirable label. Drawn: "
        r"$-\partial L/\partial\log\pi(y)$ of one completion, desirable (left) and undesirable (right), by "
        "autograd against its implicit reward relative to the loss's reference point, the loss's own "
        "`chosen_rewards − rejected_rewards`. The completions' log-ratios $\\rho$ are spread evenly around "
        f"${REFERENCE_LOGRATIO:g}$, which is also the mean log-ratio of the mismatched completions (where the loss "
        "reads them) and of the batch's own; reference log-probs "
        f"${LOGP:g}$, $\\lvert y\\rvert = {LENGTH}$. Positive raises the completion's likelihood.",
        "",
        f"![{spec.name}: gradient per completion against its implicit reward, desirable and undesirable]"
        f"(img/{spec.name}.svg)",
        "",
        f"[PNG, 2×](img/{spec.name}.png)",
        "",
    ]
    at = {round(x, 9): i for i, x in enumerate(curves[0].rewards)}
    idx = [at[x] for x in REWARD_TABLE]
    for c in curves:
        out += [f"### {c.label}", "",
                "| reward − point | " + " | ".join(f"{x:g}" for x in REWARD_TABLE) + " |", "|---|" + "---|" * len(idx),
                "| desirable | " + " | ".join(number(c.desirable[i]) for i in idx) + " |",
                "| undesirable | " + " | ".join(number(c.undesirable[i]) for i in idx) + " |", ""]
    return out


def _capability_lines(spec: LossSpec) -> list[str]:
    """The page's capabilities table: what the loss needs, takes and declares."""
    needs = sorted(n.value for n in spec.needs)
    token = [n for n in needs if n.startswith(("token", "ref_token"))]
    return [
        "## Capabilities",
        "",
        "| capability | this loss |",
        "|---|---|",
        f"| needs a reference | {'yes' if Need.REFERENCE in spec.needs else 'no'} |",
        f"| needs lengths | {'yes' if Need.LENGTHS in spec.needs else 'no'} |",
        f"| token-level inputs | {', '.join(token) or 'no'} |",
        f"| batch-coupled | {coupling(spec)} |",
        f"| takes | {takes(spec)} |",
        f"| declared monotone | {'by params' if callable(spec.monotone) else 'yes' if spec.monotone else 'no'} |",
        f"| shift-invariant | {'yes' if spec.shift_invariant else 'no'} |",
        f"| stateful | {'yes' if spec.stateful else 'no'} |",
        "",
    ]


def _curve_lines(c: Curve) -> list[str]:
    """One curve's section: its summary, its landmarks on the margin range and w_w, w_l at the table margins."""
    out = [f"### {c.label}", "", math_text(summary(c.fp)), ""]
    marks = landmarks(c.fp)
    out += [math_text(f"On [{MARGIN_MIN:g}, {MARGIN_MAX:g}]: " + ("; ".join(marks) if marks else
            "no sign change or saturation") + "."), ""]
    at = {m: i for i, m in enumerate(c.fp.margins)}
    idx = [at[m] for m in TABLE_MARGINS]
    out += ["| $m$ | " + " | ".join(f"{m:g}" for m in TABLE_MARGINS) + " |",
            "|---|" + "---|" * len(idx),
            "| $w_w$ | " + " | ".join(number(c.fp.w_w[i]) for i in idx) + " |",
            "| $w_l$ | " + " | ".join(number(c.fp.w_l[i]) for i in idx) + " |", ""]
    return out


def overview_page(specs: list[LossSpec], defaults: dict[str, Fingerprint],
                  unpaired: dict[str, UnpairedCurve] | None = None) -> str:
    """The atlas's front page: every loss by group, the overlaid default fingerprints, and what each does."""
    out = [
        "# Loss atlas",
        "",
        "<!-- Generated by `prefzoo atlas docs/atlas --builtin-only`; a test fails if it drifts. -->",
        "",
        f"Every registered loss as a picture of its gradient: {W_W} (solid) and {W_L} (dashed) against the margin "
        f"{MARGIN}, by autograd at the default parameters, reference log-probs equal ($\\Delta = m$), {LENGTHS}. "
        "A weight that **vanishes** at large $m$ means the loss stops pushing once a pair is separated (it "
        "saturates); a $w_l$ that stays negative keeps pushing the rejected response down however far it already "
        "is; $w_w$ constant and $w_l = 0$ is NLL in disguise. Each loss's page has its parameters, capabilities, "
        "covering properties and "
        "its fingerprint at three values of its main parameter. Regenerate with "
        "`prefzoo atlas docs/atlas --builtin-only`; `prefzoo inspect A B C --plot out.png` overlays any losses. "
        "The [modifiers](modifiers.md) have their own page: each drawn on a loss it applies to.",
        "",
    ]
    by_group: dict[str, list[LossSpec]] = {g: [] for g in GROUPS}
    for s in specs:
        by_group[group_of(s)].append(s)
    for group, members in by_group.items():
        if not members:
            continue
        out += [f"## {group}", "", GROUPS[group], ""]
        out += [f"![{group}: one panel per loss, gradient weights at default parameters]"
                f"(img/overview-{_slug(group)}.svg)", "", f"[PNG, 2×](img/overview-{_slug(group)}.png)", ""]
        if group == "unpaired":
            out += ["| loss | desirable at reward −10, 0, +10 | undesirable at reward −10, 0, +10 |", "|---|---|---|"]
            for s in members:
                c = (unpaired or {})[s.name]
                ends = (0, len(c.rewards) // 2, -1)
                out.append(f"| [`{s.name}`]({s.name}.md) | " + ", ".join(number(c.desirable[i]) for i in ends)
                           + " | " + ", ".join(number(c.undesirable[i]) for i in ends) + " |")
            out.append("")
            continue
        out += ["| loss | $w_w$ at $m = -50, +50$ | $w_l$ at $m = -50, +50$ | what the gradient does |",
                "|---|---|---|---|"]
        for s in members:
            fp = defaults[s.name]
            out.append(f"| [`{s.name}`]({s.name}.md) | {number(fp.w_w[0])}, {number(fp.w_w[-1])} | "
                       f"{number(fp.w_l[0])}, {number(fp.w_l[-1])} | {math_text(_behaviour(fp))} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _behaviour(fp: Fingerprint, rel: float = 0.01) -> str:
    """A few words for the overview table: what each weight does once the pair is far apart (the largest margin)."""
    scale = max(abs(x) for x in (*fp.w_w, *fp.w_l)) or 1.0
    flat_w = max(fp.w_w) - min(fp.w_w) <= rel * scale
    if flat_w and max(abs(x) for x in fp.w_l) <= rel * scale:
        return f"NLL on y_w only: a flat line, w_w = {number(fp.w_w[0])}, w_l = 0"
    fades_w = abs(fp.w_w[-1]) <= rel * max(abs(x) for x in fp.w_w)
    fades_l = abs(fp.w_l[-1]) <= rel * (max(abs(x) for x in fp.w_l) or 1.0)
    if fades_w and fades_l:
        words = ["saturates: both weights → 0 at large m"]
    elif fades_l:
        words = ["w_l → 0 at large m, but w_w stays: keeps raising y_w (NLL-like)"]
    elif fp.w_l[-1] < 0:
        words = ["keeps pushing y_l down at large m"]
    else:
        words = ["keeps raising y_l at large m"]
    if any("changes sign" in m for m in landmarks(fp, rel)):
        words.append("a weight changes sign")
    if min(fp.w_w) < -rel * scale:
        words.append("lowers y_w somewhere")
    if max(fp.w_l) > rel * scale and min(fp.w_l) >= -rel * scale:
        words.append("raises y_l too")
    return "; ".join(words)


def _slug(group: str) -> str:
    return group.lower().replace(" ", "-")


@dataclass(frozen=True)
class ModifierCurves:
    """A modifier drawn on a base loss: the base's fingerprint and the modified one, both at default parameters."""

    spec: ModifierSpec
    base: str
    plain: Fingerprint
    modified: Fingerprint


def modifier_curves(builtin_only: bool = False) -> list[ModifierCurves]:
    """Each registered modifier on the first loss of :data:`MODIFIER_BASES` it applies to (none: left out)."""
    reg, mods = get_registry(), registry_of(MODIFIERS)
    grid = dense_grid(MARGIN_MIN, MARGIN_MAX, POINTS)
    out = []
    for name in mods.names():
        m = mods.specs[name]
        if builtin_only and not m.builtin:
            continue
        base = next((b for b in MODIFIER_BASES if b in reg.specs and m.applies(reg.specs[b], reg.specs[b].params())),
                    None)
        if base is None:
            continue
        plain = Loss(reg.specs[base], reg.specs[base].params())
        modified = modify(plain, name)
        out.append(ModifierCurves(m, base, *(fingerprint(x, grid, LOGP, LOGP, LENGTH, REJECTED_LENGTH)
                                             for x in (plain, modified))))
    return out


def modifiers_page(items: list[ModifierCurves]) -> str:
    """The atlas page of the modifiers: each one's fingerprint against its base loss's, at default parameters."""
    out = [
        "# Modifiers in the atlas",
        "",
        "<!-- Generated by `prefzoo atlas docs/atlas --builtin-only`; a test fails if it drifts. -->",
        "",
        "Each [modifier](../modifiers.md) at its default parameters on a base loss (the first of "
        + ", ".join(f"`{b}`" for b in MODIFIER_BASES) + " it applies to), against the base alone: the same "
        f"single pair as the loss pages ($\\log\\pi = {LOGP:g} \\pm m/2$, reference ${LOGP:g}$, {LENGTHS}; token "
        r"log-probs spread evenly, $\sum_v \pi(v)^2 = \pi(y_t)^2$, data score gap 2). "
        "`prefzoo inspect BASE --modifier NAME` computes the same. Modifiers that act across a batch or across "
        "training steps are seen here on one pair at one step: what that shows is said under each.",
        "",
    ]
    for it in items:
        m = it.spec
        out += [f"## {m.name}", "", transforms_markdown(m), "",
                f"**Drawn on:** `{it.base}` ([its page]({it.base}.md)). **Paper:** {paper_links(m.paper)}.", ""]
        if m.batch_coupled:
            out += ["**Batch-coupled:** its transform reads the whole batch; on a single pair that batch is the pair "
                    "itself, so the curve shows the one-pair case only.", ""]
        if m.updates_reference or m.callback:
            out += ["**Acts during training:** it changes the reference model between steps (a trainer callback); "
                    "on one pair at one step the loss is the base loss's, so the two curves coincide.", ""]
        if Need.TOKEN_SQUARED_PROBS in m.needs:
            out += ["**Token distribution:** the pair here has Σ_v π(v)² = π(y_t)² at every token (as peaked as the "
                    "token itself), so a weight exp(mean_t[log π(y_t) − log Σ_v π(v)²]) is exp(−mean_t log π(y_t)): "
                    f"e^{-LOGP / LENGTH:g} at m = 0. The shape against the margin is the modifier's; the scale is "
                    "that of this made-up distribution, not of a real model's.", ""]
        out += [f"![{m.name} on {it.base}: w_w and w_l against the margin, with and without the modifier]"
                f"(img/modifier-{m.name}.svg)", "", f"[PNG, 2×](img/modifier-{m.name}.png)", ""]
        at = {x: i for i, x in enumerate(it.plain.margins)}
        idx = [at[x] for x in TABLE_MARGINS]
        out += ["| $m$ | " + " | ".join(f"{x:g}" for x in TABLE_MARGINS) + " |", "|---|" + "---|" * len(idx)]
        for label, fp in ((it.base, it.plain), (f"{it.base} + {m.name}", it.modified)):
            out += [f"| $w_w$, {label} | " + " | ".join(number(fp.w_w[i]) for i in idx) + " |",
                    f"| $w_l$, {label} | " + " | ".join(number(fp.w_l[i]) for i in idx) + " |"]
        marks = landmarks(it.modified)
        out += ["", math_text(f"With {m.name}, on [{MARGIN_MIN:g}, {MARGIN_MAX:g}]: "
                + ("; ".join(marks) if marks else "no sign change or saturation") + "."), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def write_images(out: Path, specs: list[LossSpec], curves: dict[str, list[Curve]],
                 mods: list[ModifierCurves] | None = None,
                 unpaired: dict[str, list[UnpairedCurve]] | None = None) -> None:
    """Each loss's figure at its three parameter values, one small-multiples figure per overview group and one figure
    per modifier, each as SVG and 2× PNG (:mod:`prefzoo.cli.atlas_plots`)."""
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    unpaired = unpaired or {}
    for s in specs:
        if curves[s.name]:
            fig = atlas_plots.fingerprint_figure(s.name, [(c.label, c.fp) for c in curves[s.name]])
        elif unpaired.get(s.name):
            fig = atlas_plots.two_panels(
                [(c.label, c.rewards, c.desirable, c.undesirable) for c in unpaired[s.name]],
                f"{s.name}: gradient per completion", atlas_plots.REWARD_LABEL, "desirable completion",
                "undesirable completion")
        else:
            continue
        atlas_plots.save(fig, img, s.name)
    for group in GROUPS:
        members = [s for s in specs if group_of(s) == group]
        if group == "unpaired":
            panels = [(s.name, u.rewards, u.desirable, u.undesirable)
                      for s in members for u in unpaired.get(s.name, [])[:1]]
            labels = (atlas_plots.REWARD_LABEL, "desirable", "undesirable")
        else:
            panels = [(s.name, c.fp.margins, c.fp.w_w, c.fp.w_l) for s in members for c in curves[s.name][:1]]
            labels = (atlas_plots.MARGIN_LABEL, atlas_plots.W_W_LABEL, atlas_plots.W_L_LABEL)
        if panels:
            fig = atlas_plots.small_multiples(panels, f"{group}: gradient weights at default parameters", *labels)
            atlas_plots.save(fig, img, f"overview-{_slug(group)}")
    for it in mods or []:
        fig = atlas_plots.fingerprint_figure(f"{it.spec.name} on {it.base}", [
            (it.base, it.plain), (f"{it.base} + {it.spec.name}", it.modified)])
        atlas_plots.save(fig, img, f"modifier-{it.spec.name}")


Atlas = tuple[dict[str, str], list[LossSpec], dict[str, list[Curve]], list[ModifierCurves],
              dict[str, list[UnpairedCurve]]]


def atlas_pages(builtin_only: bool = False) -> Atlas:
    """{file name: Markdown} for every page, with the specs and curves (paired, modifiers, unpaired) they were made
    from."""
    reg = get_registry()
    specs = [reg.specs[n] for n in reg.names() if not builtin_only or reg.specs[n].builtin]
    curves = {s.name: curves_of(s) for s in specs}
    unpaired = {s.name: unpaired_curves_of(s) for s in specs}
    pages = {f"{s.name}.md": loss_page(s, curves[s.name], unpaired[s.name]) for s in specs}
    pages["index.md"] = overview_page(specs, {n: c[0].fp for n, c in curves.items() if c},
                                      {n: c[0] for n, c in unpaired.items() if c})
    mods = modifier_curves(builtin_only)
    if mods:
        pages["modifiers.md"] = modifiers_page(mods)
    return pages, specs, curves, mods, unpaired


def run(args: argparse.Namespace) -> int:
    out = Path(args.out_dir)
    pages, specs, curves, mods, unpaired = atlas_pages(args.builtin_only)
    if not args.no_images:
        pyplot()  # fail before writing anything when matplotlib is missing
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.md"):
        if stale.name not in pages:
            stale.unlink()
    for name, text in pages.items():
        (out / name).write_text(text, encoding="utf-8")
    if not args.no_images:
        write_images(out, specs, curves, mods, unpaired)
    print(f"wrote {len(pages)} pages to {out}" + ("" if args.no_images else f" and their plots to {out / 'img'}"))
    return 0
