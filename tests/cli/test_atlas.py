"""The loss atlas (docs/atlas, `prefzoo atlas`), `prefzoo inspect A B C --plot` and the site's home page."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import prefzoo
from prefzoo.cli.atlas import atlas_pages, sweep_values
from prefzoo.cli.inspect import Fingerprint, fingerprint, landmarks, sign_changes
from prefzoo.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
ATLAS = ROOT / "docs" / "atlas"


def test_atlas_pages_are_generated_from_the_registry():
    """docs/atlas/*.md equal `prefzoo atlas docs/atlas --builtin-only` (the data, not the images' pixels)."""
    pages, specs, curves, _, unpaired = atlas_pages(builtin_only=True)
    committed = {p.name: p.read_text(encoding="utf-8") for p in ATLAS.glob("*.md")}
    assert sorted(committed) == sorted(pages), "docs/atlas is stale: run `prefzoo atlas docs/atlas --builtin-only`"
    stale = [name for name, text in pages.items() if committed[name] != text]
    assert not stale, f"docs/atlas is stale ({', '.join(stale)}): run `prefzoo atlas docs/atlas --builtin-only`"
    assert {s.name for s in specs} == {s for s in prefzoo.list_losses() if prefzoo.loss_spec(s).builtin}
    for s in specs:  # every loss with a margin has both images, and its page shows them
        if curves[s.name] or unpaired[s.name]:
            assert (ATLAS / "img" / f"{s.name}.png").is_file() and (ATLAS / "img" / f"{s.name}.svg").is_file()
            assert f"(img/{s.name}.svg)" in pages[f"{s.name}.md"]
    for img in re.findall(r"\(img/([^)]+)\)", pages["index.md"]):
        assert (ATLAS / "img" / img).is_file(), img


def test_overview_shows_the_mmpo_identity_as_a_flat_line():
    pages, *_ = atlas_pages(builtin_only=True)
    row = next(line for line in pages["index.md"].splitlines() if line.startswith("| [`mmpo`]"))
    assert "NLL on $y_w$ only: a flat line, $w_w = +1$, $w_l = 0$" in row
    row = next(line for line in pages["index.md"].splitlines() if line.startswith("| [`dpo`]"))
    assert "saturates" in row and "flat line" not in row


def test_the_cli_sentences_reach_the_pages_as_math():
    """`prefzoo inspect` prints its findings as text; the atlas typesets their formulas (no bare w_w outside $...$)."""
    from prefzoo.cli.atlas import math_text

    assert math_text("w_w + w_l = 1 at every margin") == "$w_w + w_l = 1$ at every margin"
    assert math_text("w_w vanishes (|w_w| < 0.01·max) for m ≥ +12") == (
        r"$w_w$ vanishes ($\lvert w_w\rvert < 0.01\cdot\max$) for $m \ge +12$")
    pages, *_ = atlas_pages(builtin_only=True)
    for name, text in pages.items():  # the generated sentences: summaries, landmarks, the overview's last column
        for line in text.splitlines():
            if re.match(r"(On |With |\$w_|\| \[`)", line):
                prose = re.sub(r"\$[^$]*\$|`[^`]*`", "", line)  # math and code aside
                assert not re.search(r"\b[wy]_[wl]\b", prose), f"{name}: a symbol outside math: {line}"


def test_modifiers_are_drawn_on_a_loss_they_apply_to():
    from prefzoo.cli.atlas import modifier_curves

    items = {it.spec.name: it for it in modifier_curves(builtin_only=True)}
    assert set(items) == {m for m in prefzoo.list_modifiers() if prefzoo.modifier_spec(m).builtin}
    tr = items["tr-dpo"]  # moves the reference between steps: on one pair at one step, the base loss exactly
    assert tr.modified.w_w == tr.plain.w_w and tr.modified.w_l == tr.plain.w_l
    ld = items["ld-dpo"]  # α = 0.5 on the 5 tokens of y_l beyond |y_w| = 10: y_l's weight shrinks, by 1/6 at m = 0
    i = ld.plain.margins.index(0.0)
    assert ld.modified.w_l[i] == pytest.approx(ld.plain.w_l[i] * (10 + 0.5 * 5) / 15)


def test_sweep_values_stay_in_range():
    spec = prefzoo.loss_spec("robust")  # label_smoothing in [0, 0.5): beta is the main parameter
    assert sweep_values(spec, next(i for i in prefzoo.param_infos(spec.params_cls) if i.name == "beta")) == [
        0.1, 0.025, 0.4]
    spec = prefzoo.loss_spec("exo-pair")
    info = next(i for i in prefzoo.param_infos(spec.params_cls) if i.name == "label_smoothing")
    vals = sweep_values(spec, info)  # 0 < ε < 1 excludes ×4 of nothing here, but ×4 = 0.004 is fine
    assert len(vals) == 3 and all(info.check(v) is None for v in vals)


def test_sign_changes_interpolate_between_grid_points():
    assert sign_changes([0.0, 1.0, 2.0, 3.0], [1.0, 0.5, -0.5, -1.0], tol=0.01) == [1.5]
    assert sign_changes([0.0, 1.0, 2.0], [1.0, 0.0, 0.0], tol=0.01) == []  # reaching 0 is not a sign change


def test_landmarks_find_where_hinge_stops_and_dpo_saturates():
    grid = [float(m) for m in range(-40, 41)]
    hinge = landmarks(fingerprint(prefzoo.get_loss("hinge", beta=0.1), grid))  # w = ±β for βΔ < 1, else 0
    assert "w_w vanishes (|w_w| < 0.01·max) for m ≥ +10" in hinge
    assert "w_w saturates at +0.1 for m ≤ +9" in hinge
    dpo = landmarks(fingerprint(prefzoo.get_loss("dpo", beta=1.0), grid))  # σ(−Δ) < 1% of 1 from Δ ≈ 4.6 on
    assert "w_w vanishes (|w_w| < 0.01·max) for m ≥ +5" in dpo and "w_l saturates at -1 for m ≤ -5" in dpo
    flat = landmarks(Fingerprint([0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]))
    assert flat == ["w_w is constant on the grid (+1)", "w_l is constant on the grid (0)"]


def test_inspect_overlays_several_losses_and_prints_landmarks(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    svg = tmp_path / "fp.svg"
    assert main(["inspect", "dpo", "hinge", "mmpo", "--min", "-20", "--max", "20", "--points", "3",
                 "--plot", str(svg)]) == 0
    out = capsys.readouterr().out
    assert out.count("w_w = −∂L/∂log π(y_w),  w_l") == 3
    assert "hinge: max(0, 1 − βΔ)" in out and "w_w vanishes (|w_w| < 0.01·max) for m ≥ +10" in out  # Δ = 1/β
    assert "w_l is constant on the grid (0)" in out  # mmpo
    text = svg.read_text(encoding="utf-8")
    assert all(f"{n}: w_w" in text for n in ("dpo", "hinge", "mmpo"))


def test_inspect_refuses_unpaired_losses_in_one_line(capsys):
    assert main(["inspect", "kto"]) == 2
    assert "'kto' takes unpaired completions, not pairs: it has no margin to sweep" in capsys.readouterr().err


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_home_page_is_the_readme_with_site_links():
    """The site's index.md is README.md with its links into docs/ made relative; every link lands on a page."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    home = _hooks().home_page(readme)
    links = re.compile(r"\]\([^)]*\)")
    assert links.sub("]()", home) == links.sub("]()", _hooks().wrap_commands(readme))  # only targets change
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", home)
    assert targets and "docs/losses.md" not in targets
    missing = [t for t in targets if not (ROOT / "docs" / t).exists()]
    assert not missing, f"README links that are not site pages: {missing}"


def test_long_shell_lines_wrap_on_the_home_page_and_stay_one_command():
    """README's quickstart lines are one line each; on the site they break before `&&`, with a backslash."""
    hooks = _hooks()
    long = "python3.11 -m venv .venv && .venv/bin/pip install tox tox-uv && .venv/bin/tox run-parallel --parallel 2"
    wrapped = hooks.wrap_commands(f"```bash\n{long}\n# {'word ' * 30}\n```\n`{long}`")
    code = wrapped.split("```")[1]
    assert max(len(line) for line in code.splitlines()) <= hooks.CODE_WIDTH
    assert code.replace(" \\\n    && ", " && ").splitlines()[1] == long
    assert wrapped.endswith(f"`{long}`")  # inline code and other text are left alone
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(len(line) <= hooks.CODE_WIDTH for line in hooks.home_page(readme).split("```bash")[1].split("```")[0]
               .splitlines())


def test_long_commands_on_docs_pages_wrap_before_options_and_comments_go_above():
    """A docs page's long shell line with a trailing comment: the comment on its own line above, the command broken
    before its --options; joined back it is the same command."""
    hooks = _hooks()
    cmd = "python benchmarks/bench_train_throughput.py --cases dpo --prefzoo-option share_prompt=true --repeats 3"
    wrapped = hooks.wrap_commands(f"```bash\n{cmd}   # one case, one option\n```\n")
    code = wrapped.split("```bash\n")[1].split("\n```")[0]
    assert code.splitlines()[0] == "# one case, one option"
    assert max(len(line) for line in code.splitlines()) <= hooks.CODE_WIDTH
    assert " ".join(code.split("\n", 1)[1].replace(" \\\n", " ").split()) == cmd


def test_links_outside_docs_are_named_not_linked(tmp_path):
    hooks = _hooks()
    md = "see [the example](../examples/trl_dpo_mmpo.py) and [gone](../examples/nope.py) and [p](losses.md)"
    out = hooks.outside_links(md, ROOT / "docs", ROOT / "docs")
    assert out == ("see the example (repository file `examples/trl_dpo_mmpo.py`) and [gone](../examples/nope.py) "
                   "and [p](losses.md)")


def test_sphinx_roles_are_dropped_from_rendered_docstrings():
    html = "pairs, :class:<code>PreferenceBatch</code> and :func:<code>get_loss</code>; a ratio 1:2"
    assert _hooks().on_page_content(html, None, None, None) == "pairs, <code>PreferenceBatch</code> and " \
        "<code>get_loss</code>; a ratio 1:2"


def test_rounding_noise_of_a_zero_weight_is_drawn_flat():
    """mmpo's w_l is 0 up to ±1.5e-15 of rounding: the atlas draws it as the flat 0 the page's text states, not as a
    zig-zag on an axis scaled to 1e-15; a real small weight is drawn as it is."""
    from prefzoo.cli import atlas_plots
    from prefzoo.cli.inspect import Fingerprint

    m = [-1.0, 0.0, 1.0]
    fp = Fingerprint(margins=m, score_margins=m, w_w=[1.0, 1.0, 1.0], w_l=[1.5e-15, -1.5e-15, 2e-16])
    fig = atlas_plots.fingerprint_figure("mmpo", [("beta = 0.1", fp)])
    try:
        right = fig.axes[1]
        assert [list(line.get_ydata()) for line in right.lines if len(line.get_xdata()) == 3] == [[0.0, 0.0, 0.0]]
        low, high = right.get_ylim()
        assert high - low > 1e-3, (low, high)
    finally:
        atlas_plots.pyplot().close(fig)
    assert atlas_plots.exact([1e-9, -2e-15, 0.5]) == [1e-9, 0.0, 0.5]
