"""One formula per loss: ``LossSpec.formula_tex`` is what the docs typeset and what `prefzoo losses NAME` prints.

The CLI prints its plain-text reading (``LossSpec.formula``, :func:`prefzoo.spec.tex_to_text`); the atlas page and
the catalogue put the LaTeX itself in a display-math block. Changing the LaTeX alone must change both.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from prefzoo.cli.atlas import loss_page
from prefzoo.cli.losses import DISPLAY_WIDTH, catalogue_markdown, describe, display_lines, formula_markdown
from prefzoo.registry import get_registry
from prefzoo.spec import param_infos, tex_to_text, text_of

BUILTIN = [n for n in get_registry().names() if get_registry().specs[n].builtin]


def _cli_formula(spec) -> str:
    line = next(x for x in describe(spec).splitlines() if x.strip().startswith("loss:"))
    return line.split("L = ", 1)[1]


def _page_formula(page: str) -> str:
    """The LaTeX of the page's display formula, its clauses joined again as ``formula_tex`` writes them."""
    lines = page.splitlines()
    tex = lines[lines.index("$$") + 1]
    if tex.startswith(r"\begin{gathered}"):
        tex = tex.removeprefix(r"\begin{gathered}").removesuffix(r"\end{gathered}").replace(r" \\ ", r"\quad ")
    return tex.removeprefix("L = ")


@pytest.mark.parametrize("name", BUILTIN)
def test_cli_and_pages_read_the_one_latex_formula(name):
    spec = get_registry().specs[name]
    assert spec.formula_tex, f"{name}: a built-in loss states its formula in LaTeX (formula_tex)"
    assert _page_formula(loss_page(spec, [])).replace(" ", "") == spec.formula_tex.replace(" ", "")
    assert _cli_formula(spec) == tex_to_text(spec.formula_tex) == spec.formula
    assert "\\" not in spec.formula, f"{name}: a LaTeX command tex_to_text does not know: {spec.formula}"


def test_changing_the_latex_changes_the_cli_and_the_page():
    """Guards the single source: a CLI or page that read a second copy of the formula would keep the old one."""
    spec = get_registry().specs["dpo"]
    changed = dataclasses.replace(spec, formula_tex=r"\beta\cdot\frac{\rho_w}{\lvert y_w\rvert}")
    assert _cli_formula(changed) == "β·ρ_w/|y_w|"
    assert _page_formula(loss_page(changed, [])) == r"\beta\cdot\frac{\rho_w}{\lvert y_w\rvert}"
    assert _cli_formula(spec) != _cli_formula(changed)


def test_catalogue_typesets_every_builtin_formula():
    text = catalogue_markdown()
    for name in BUILTIN:
        assert f"$$\n{display_lines('L = ' + get_registry().specs[name].formula_tex)}\n$$" in text, name


def test_long_formulas_break_at_their_clauses_and_short_ones_do_not():
    short = r"-\log\sigma(\beta\Delta),\quad \Delta = x"
    assert display_lines(short) == short
    long = (r"\lambda_D\cdot\sigma(\beta\rho)\ \text{desirable},\quad "
            r"\lambda_U\cdot\sigma(-\beta\rho)\ \text{undesirable}")
    assert display_lines(long) == (r"\begin{gathered}\lambda_D\cdot\sigma(\beta\rho)\ \text{desirable}, \\ "
                                   r"\lambda_U\cdot\sigma(-\beta\rho)\ \text{undesirable}\end{gathered}")


def test_a_plugin_without_latex_keeps_its_text_formula_as_code():
    spec = dataclasses.replace(get_registry().specs["dpo"], formula_tex="", formula="−log σ(x)")
    assert spec.formula == "−log σ(x)"
    assert formula_markdown(spec)[0] == "**Loss:** `L = −log σ(x)`"


@pytest.mark.parametrize(
    ("tex", "text"),
    [  # hand-read: what a reader types for each
        (r"-\log\sigma(\beta\Delta)", "−log σ(βΔ)"),
        (r"\left(\frac{\Delta}{\lvert y\rvert} - \frac{1}{2\beta}\right)^2", "(Δ/|y| − 1/(2β))²"),
        (r"\frac{a + b}{1 - 2\varepsilon}", "(a + b)/(1 − 2ε)"),
        (r"-\frac{\log\pi_\theta(y_w\mid x)}{\lvert y_w\rvert}", "−log π_θ(y_w|x)/|y_w|"),
        (r"\log\pi_{\mathrm{ref}} + \tfrac{1}{2}", "log π_ref + ½"),
        (r"\max\bigl(0, 1\bigr)\ \text{if well-posed}", "max(0, 1) if well-posed"),
        (r"e^{u_{\tau(k)}}", "e^(u_{τ(k)})"),  # a superscript of several symbols in parentheses
        (r"\hat{H}", "Ĥ"),
        (r"\unknown + 1", "\\unknown + 1"),  # kept, so the built-in formulas test above can find it
    ],
)
def test_tex_to_text(tex, text):
    assert tex_to_text(tex) == text


def test_modifiers_transforms_come_from_their_latex():
    """`prefzoo modifiers NAME` prints ``transforms``, the reading of the ``transforms_tex`` the docs typeset."""
    from prefzoo.cli.modifiers import catalogue_markdown as modifiers_markdown
    from prefzoo.cli.modifiers import describe as describe_modifier
    from prefzoo.cli.modifiers import transforms_markdown
    from prefzoo.registry import MODIFIERS, registry_of

    reg = registry_of(MODIFIERS)
    text = modifiers_markdown()
    for name in reg.names():
        m = reg.specs[name]
        assert m.transforms_tex and m.transforms == tex_to_text(m.transforms_tex), name
        assert "\\" not in m.transforms, f"{name}: {m.transforms}"
        assert transforms_markdown(m) in text, name
        long = len(m.transforms_tex) > DISPLAY_WIDTH  # display math, its clauses on lines of their own
        assert transforms_markdown(m).startswith("**Transforms:**\n\n$$\n" if long else "**Transforms:** $"), name
        assert m.transforms in describe_modifier(m), name
    changed = dataclasses.replace(reg.specs["wpo"], transforms_tex=r"L_i \leftarrow 2\cdot L_i")
    assert changed.transforms == "L_i ← 2·L_i" and changed.transforms in describe_modifier(changed)


# --- inline math in a spec's prose ------------------------------------------------------------------------------

_PLAIN_MATH = re.compile(r"[α-ωΑ-Ω∇∂Σ√≈≤≥‖₀-₉]|log π|π_|\|y\|")  # symbols a formula uses, outside $...$


def _prose_outside_math(markdown: str) -> list[str]:
    """The lines of a page with display math, inline math, code and links' targets taken out."""
    text = re.sub(r"\$\$.*?\$\$|```.*?```", "", markdown, flags=re.S)
    lines = (re.sub(r"\$[^$]+\$|`[^`]*`|\]\([^)]*\)", "", line) for line in text.splitlines())
    return [line.replace("β-DPO", "beta-DPO") for line in lines]  # a paper's name is not a formula


def _prose_fields(spec) -> list[str]:
    docs = [i.doc for i in param_infos(spec.params_cls)]
    return [spec.description, spec.notes, spec.scores, *docs]


@pytest.mark.parametrize("name", BUILTIN)
def test_a_builtin_loss_writes_the_formulas_in_its_prose_as_inline_math(name):
    spec = get_registry().specs[name]
    plain = [line for field in _prose_fields(spec) for line in _prose_outside_math(field) if _PLAIN_MATH.search(line)]
    assert not plain, f"{name}: write formulas in prose as $...$ (LaTeX), the docs typeset them: {plain}"


def test_the_modifier_pages_prose_has_no_plain_formula():
    from prefzoo.cli.modifiers import catalogue_markdown as modifiers_markdown

    plain = [line for line in _prose_outside_math(modifiers_markdown()) if _PLAIN_MATH.search(line)]
    assert not plain, plain


@pytest.mark.parametrize(
    ("prose", "text"),
    [
        (r"$\beta\cdot(\log\pi_\theta(y\mid x) - \log\pi_{\mathrm{ref}}(y\mid x))$ (DPO implicit reward)",
         "β·(log π_θ(y|x) − log π_ref(y|x)) (DPO implicit reward)"),
        (r"weight $\alpha$ of $\sqrt{V}/2$ and $\lvert\bar{\Delta}\rvert \approx 1$", "weight α of √V/2 and |Δ̄| ≈ 1"),
        (r"reward shape $r = (1 - \pi^{-\alpha})/\alpha$", "reward shape r = (1 − π^(−α))/α"),
        ("a plugin's plain text, π and all", "a plugin's plain text, π and all"),
    ],
)
def test_the_cli_reads_inline_math_as_text(prose, text):
    assert text_of(prose) == text


def test_the_cli_prints_no_latex_for_any_builtin_loss_or_modifier():
    from prefzoo.cli.modifiers import describe as describe_modifier
    from prefzoo.registry import MODIFIERS, registry_of

    printed = [describe(get_registry().specs[n]) for n in BUILTIN]
    printed += [describe_modifier(s) for s in registry_of(MODIFIERS).specs.values()]
    leaks = [line for block in printed for line in block.splitlines() if "$" in line or "\\" in line]
    assert not leaks, leaks


def test_the_property_page_writes_its_formulas_as_math():
    page = (Path(__file__).resolve().parents[2] / "docs" / "properties.md").read_text()
    plain = [line for line in _prose_outside_math(page) if _PLAIN_MATH.search(line)]
    assert not plain, plain


def test_a_formula_the_cli_cannot_read_stays_as_written():
    """A plugin's prose with unbalanced braces inside $...$ prints as written, never a traceback."""
    assert text_of(r"weight $\frac{1}{2$ of $\beta$") == r"weight $\frac{1}{2$ of β"
