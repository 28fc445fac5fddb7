"""`prefzoo losses`, `show` and `inspect` as a user runs them."""

from __future__ import annotations

import math

import pytest

import prefzoo
from prefzoo.cli.inspect import fingerprint
from prefzoo.cli.main import main


def test_losses_table_lists_every_loss(capsys):
    assert main(["losses"]) == 0
    out = capsys.readouterr().out
    first_col = {line.split()[0] for line in out.splitlines()[2:] if line.strip() and not line.startswith("warning")}
    assert set(prefzoo.list_losses()) <= first_col
    assert "reference" in out.splitlines()[0] and "plugin" in out.splitlines()[0]


def test_show_describes_parameters_and_paper(capsys):
    assert main(["show", "simpo"]) == 0
    out = capsys.readouterr().out
    assert "gamma_beta_ratio = 0.5" in out and "arXiv:2405.14734" in out and "−log σ" in out


def test_unknown_name_exits_2_with_suggestion(capsys):
    assert main(["losses", "simpoo"]) == 2
    assert "did you mean 'simpo'" in capsys.readouterr().err


def test_inspect_mmpo_shows_the_identity(capsys):
    assert main(["inspect", "mmpo", "--param", "beta=0.5", "--points", "5"]) == 0
    out = capsys.readouterr().out
    assert "w_w = 1 and w_l = 0 at every margin" in out and "plain NLL on the chosen response" in out


def test_inspect_bad_param_exits_2(capsys):
    assert main(["inspect", "mmpo", "--param", "gamma=1"]) == 2
    assert "gamma" in capsys.readouterr().err
    assert main(["inspect", "mmpo", "--loss-param", "gamma=1"]) == 2  # the spelling of train and eval; --param: alias
    assert "no parameter 'gamma'" in capsys.readouterr().err


@pytest.mark.parametrize("m", [-8.0, -1.0, 0.0, 2.5, 9.0])
def test_fingerprints_match_theory(m):
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    mm = fingerprint(prefzoo.get_loss("mmpo"), [m])
    assert mm.w_w[0] == pytest.approx(1.0, abs=1e-12) and mm.w_l[0] == pytest.approx(0.0, abs=1e-12)
    na = fingerprint(prefzoo.get_loss("mmpo-no-aux"), [m])
    d = na.score_margins[0]  # s_w − s_l
    assert na.w_w[0] == pytest.approx(sig(d)) and na.w_l[0] == pytest.approx(sig(-d))
    dp = fingerprint(prefzoo.get_loss("dpo", beta=0.3), [m])  # reference equal, so Δ = m
    assert dp.w_w[0] == pytest.approx(0.3 * sig(-0.3 * m)) and dp.w_l[0] == pytest.approx(-0.3 * sig(-0.3 * m))


def test_inspect_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "fp.png"
    assert main(["inspect", "dpo", "--points", "3", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_docs_catalogue_is_generated_from_the_registry():
    """docs/losses.md and docs/losses/*.md must equal `prefzoo losses --markdown-dir docs` (built-in losses only, one
    page per family), so they cannot drift; every loss of `prefzoo losses --markdown` has its entry on one page."""
    from pathlib import Path

    from prefzoo.cli.losses import catalogue_markdown, catalogue_pages

    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = catalogue_pages()
    stale = [rel for rel, text in pages.items() if (docs / rel).read_text(encoding="utf-8") != text]
    extra = sorted(f"losses/{p.name}" for p in (docs / "losses").glob("*.md") if f"losses/{p.name}" not in pages)
    assert not stale and not extra, f"stale catalogue pages {stale}, pages to remove {extra}: run " \
        "`prefzoo losses --markdown-dir docs`"
    entries = {line for text in pages.values() for line in text.splitlines() if line.startswith("## ")}
    single = {line for line in catalogue_markdown().splitlines() if line.startswith("## ")}
    assert single <= entries | {"## NLL reduction"}
    assert len(pages) >= 6 and all(t.count("\n## ") <= 15 for rel, t in pages.items() if rel != "losses.md")
