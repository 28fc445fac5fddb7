"""The built documentation site: math typeset by a bundled KaTeX, nothing loaded from another server, every atlas page
in the menu, images with alt text, no work-log words, and (where Chromium is installed) pages that render.

The ``site`` fixture (conftest.py) is the built site.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
KATEX = DOCS / "assets" / "katex"
# words of a lab notebook, not of documentation: history belongs in git
HISTORY = re.compile(r"\b(issue #?\d+|issues? \d+|session \d+|rebased|measured again|since rebased)\b", re.I)
# phrases of a work log: a page states what is true; how it came to be goes to the changelog (changelog.md, history/)
WORK_LOG_PHRASES = (
    r"fresh clone of this branch", r"this branch\b", r"one commit earlier", r"(?:before|after) this change",
    r"(?:the )?goals? (?:is|are|was|were) (?:not )?met", r"goal's edge", r"\b(?:it|they|which|that|this) used to\b",
    r"(?:before|after|with|without) the fix\b", r"\bthe done-when", r"\bsuperseded\b", r"other engineers",
    r"measured afterwards", r"\b(?:is|are) now\b",
    r"\bnow (?:sets|runs|keeps|meets|ships|declares|reaches|reach|catches|costs|takes|prints|looks)\b",
    r"\bsince the table above", r"\bthe old command", r"\bthe new command",
)
WORK_LOG = re.compile("|".join(f"(?:{p})" for p in WORK_LOG_PHRASES), re.I)
HISTORY_PAGES = ("changelog.md",)  # where history belongs: not checked for work-log phrasing
MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_katex_is_bundled_and_every_font_it_names_is_there(site):
    for rel in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js"):
        assert (site / "assets" / "katex" / rel).is_file(), rel
    css = (site / "assets" / "katex" / "katex.min.css").read_text(encoding="utf-8")
    fonts = re.findall(r"url\((fonts/[^)]+)\)", css)
    assert fonts, "the bundled KaTeX CSS names no fonts"
    missing = [f for f in fonts if not (site / "assets" / "katex" / f).is_file()]
    assert not missing, f"fonts the KaTeX CSS loads but the site lacks: {missing}"
    home = (site / "index.html").read_text(encoding="utf-8")
    for rel in ("katex.min.js", "katex.min.css", "auto-render.min.js"):
        assert re.search(rf'(src|href)="[^"]*assets/katex/[^"]*{re.escape(rel)}"', home), f"home page lacks {rel}"


def test_no_page_loads_anything_from_another_server(site):
    """Scripts, styles, fonts and images come from the site itself: it works offline (links may leave it)."""
    remote = re.compile(r'<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)="(?:https?:)?//[^"]*"', re.I)
    found = {p.relative_to(site).as_posix(): remote.findall(p.read_text(encoding="utf-8"))[:2] for p in pages(site)}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"pages that load from another server: {dict(list(found.items())[:5])}"
    for css in site.rglob("*.css"):
        urls = re.findall(r"url\(\s*['\"]?((?:https?:)?//[^'\")]+)", css.read_text(encoding="utf-8"))
        assert not urls, f"{css.relative_to(site)} loads {urls[:3]}"


def test_every_atlas_page_is_in_the_menu():
    import yaml

    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "not_in_nav" not in text
    listed = set(re.findall(r"atlas/[\w.-]+\.md", json.dumps(yaml.safe_load(text)["nav"])))
    on_disk = {f"atlas/{p.name}" for p in (DOCS / "atlas").glob("*.md")}
    assert on_disk - listed == set(), f"atlas pages missing from mkdocs.yml's nav: {sorted(on_disk - listed)}"


def test_the_catalogue_links_every_atlas_page():
    catalogue = "".join(p.read_text(encoding="utf-8") for p in [DOCS / "losses.md", *(DOCS / "losses").glob("*.md")])
    pages_ = {p.stem for p in (DOCS / "atlas").glob("*.md")} - {"index", "modifiers"}
    missing = [n for n in sorted(pages_) if f"](../atlas/{n}.md)" not in catalogue]
    assert not missing, f"catalogue entries without their atlas link: {missing}"


def test_every_image_has_alt_text(site):
    bad = []
    for p in pages(site):
        for tag in re.findall(r"<img\b[^>]*>", p.read_text(encoding="utf-8")):
            alt = re.search(r'\balt="([^"]*)"', tag)
            if not (alt and alt.group(1).strip()):
                bad.append(f"{p.relative_to(site)}: {tag[:80]}")
    assert not bad, "images without alt text:\n" + "\n".join(bad[:10])


def test_no_work_log_words_in_the_docs():
    """The docs say what is true now; which issue or session found it is git's history."""
    hits = []
    for md in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for i, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            if m := HISTORY.search(line):
                hits.append(f"{md.relative_to(ROOT)}:{i}: {m.group(0)!r}")
    assert not hits, "work-log words in the docs:\n" + "\n".join(hits[:20])


def test_no_work_log_phrasing_outside_the_changelog():
    """A user page states current facts ("the step takes 3 s"), not what a change did ("before this change it took
    5 s", "The goal is met."): that story goes to the changelog or the history pages beside it."""
    hits = []
    for md in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        rel = md.relative_to(DOCS).as_posix() if md.is_relative_to(DOCS) else md.name
        if rel.startswith(HISTORY_PAGES):
            continue
        for i, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            hits += [f"{md.relative_to(ROOT)}:{i}: {m.group(0)!r}" for m in WORK_LOG.finditer(line)]
    assert not hits, "work-log phrasing on user pages (state the fact; history goes to the changelog):\n" + "\n".join(
        hits[:30])


def test_the_work_log_check_finds_what_it_must():
    for text in ("README command 1 on a fresh clone of this branch", "from a fresh clone one commit earlier",
                 "`prefzoo train` before this change spent", "**The goal is met.**", "It used to run the model",
                 "(before the fix, the test failed)", "other engineers' jobs", "it was measured afterwards",
                 "It now declares", "the default flags now reach 0.23", "speed at the goal's edge"):
        assert WORK_LOG.search(text), text
    for text in ("the command used to run the tests", "naming the fix", "no longer finite", "for now on",
                 "the verdict per prompt", "a fresh clone of the repository", "the goals of a loss"):
        assert not WORK_LOG.search(text), text


def test_the_history_check_finds_what_it_must():
    for text in ("measured in issue 17", "session 18 found", "since rebased as b2ce675", "Issue #4"):
        assert HISTORY.search(text), text
    for text in ("a pytest session", "the sessions' cache", "an issue tracker"):
        assert not HISTORY.search(text), text


def _formulas(site: Path) -> list[tuple[str, str]]:
    out = []
    for p in pages(site):
        for _, body in MATH.findall(p.read_text(encoding="utf-8")):
            tex = html.unescape(body).strip()
            display = tex.startswith("\\[")
            out.append((p.relative_to(site).as_posix(), tex[2:-2].strip() if tex[:2] in ("\\[", "\\(") else tex))
            assert tex[:2] in ("\\[", "\\(") and tex[-2:] in ("\\]", "\\)") and display == tex.endswith("\\]"), tex
    return out


def test_every_formula_is_valid_katex(site, tmp_path):
    """Every math span of every page through the bundled KaTeX with throwOnError: a formula it cannot typeset fails."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the formulas are not typeset here (the browser smoke test still runs)")
    formulas = _formulas(site)
    assert len(formulas) > 100, "the atlas, catalogue and theory pages hold hundreds of formulas"
    (tmp_path / "f.json").write_text(json.dumps(formulas), encoding="utf-8")
    script = (
        "const katex = require(process.argv[1]); const fs = require('fs');"
        "const bad = [];"
        "for (const [page, tex] of JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))) {"
        "  try { katex.renderToString(tex, {throwOnError: true}); } catch (e) { bad.push(page + ': ' + e.message); }"
        "}"
        "console.log(JSON.stringify(bad));"
    )
    out = subprocess.run([node, "-e", script, str(KATEX / "katex.min.js"), str(tmp_path / "f.json")],
                         capture_output=True, text=True, check=True, timeout=120)
    bad = json.loads(out.stdout)
    assert not bad, "formulas KaTeX cannot typeset:\n" + "\n".join(bad[:10])


def test_katex_check_fails_on_a_broken_formula(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = "const k = require(process.argv[1]); k.renderToString('\\\\frac{1}{', {throwOnError: true});"
    out = subprocess.run([node, "-e", script, str(KATEX / "katex.min.js")], capture_output=True, text=True)
    assert out.returncode != 0 and "ParseError" in out.stderr


WORD_LIMIT = 3000  # words of prose a page may hold (code blocks not counted): a longer page is several pages
# pages still over the limit, each to be split; the list may only shrink (the test fails when one gets under it)
OVER_LIMIT: dict[str, str] = {}


def words(markdown: str) -> int:
    return len(re.findall(r"[A-Za-z][\w'’-]*", re.sub(r"```.*?```", "", markdown, flags=re.S)))


def test_pages_stay_under_the_word_limit():
    counts = {p.relative_to(DOCS).as_posix(): words(p.read_text(encoding="utf-8")) for p in DOCS.rglob("*.md")}
    over = sorted(f"{page} ({n} words)" for page, n in counts.items() if n > WORD_LIMIT and page not in OVER_LIMIT)
    assert not over, f"pages over {WORD_LIMIT} words: split them: {over}"
    done = sorted(page for page in OVER_LIMIT if counts.get(page, 0) <= WORD_LIMIT)
    assert not done, f"now under the limit: take them off OVER_LIMIT: {done}"
    assert words("one two\n```\nnot counted here\n```\nthree") == 3


PATH_TEXT = re.compile(r"\[`?((?:docs|plugins|prefzoo|tests|benchmarks)/[^\]`]*|[\w./-]+\.(?:md|py|toml|yml))`?\]\(")


def test_the_home_page_names_pages_not_files():
    """README.md is the site's home page: its links read as the pages' names ("the theory page"), not as repository
    paths ("docs/theory.md"), and it holds no list of pages that repeats the site's menu."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bad = PATH_TEXT.findall(readme)
    assert not bad, f"README links whose text is a file path: {bad}"
    assert "| page | what it holds |" not in readme, "README repeats the site's menu as a table"
    assert PATH_TEXT.search("in [docs/theory.md](docs/theory.md)") and PATH_TEXT.search("[`plugins/x`](plugins/x)")
    assert not PATH_TEXT.search("the [theory page](docs/theory.md)")


def test_the_cli_reference_keeps_its_asterisks(site):
    """A weighted sum of losses (`0.8*dpo + 0.2*sft`) reads as typed: Markdown emphasis must not eat the asterisks."""
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "cli" / "index.html").read_text(encoding="utf-8")))
    assert "0.8*dpo + 0.2*sft" in text, "the CLI reference shows the weighted-sum example without its asterisks"


def test_search_results_show_no_raw_tex(site):
    """The search index (what the results list shows) holds formulas as plain text: no ``\\(`` or ``\\[``."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    raw = re.compile(r"\\[()[\]]")
    bad = [f"{d['location']}: {d['title'][:60]!r}" for d in index["docs"] if raw.search(d["title"] + d["text"])]
    assert not bad, f"{len(bad)} search entries with raw TeX, e.g. {bad[:5]}"
    assert any("ρ" in d["text"] for d in index["docs"]), "the catalogue's notation, as text"


def _atlas_groups() -> dict[str, list[str]]:
    """The atlas overview's families (its ``## group`` sections) and the atlas pages each one's table links."""
    groups = {}
    for section in re.split(r"\n## ", (DOCS / "atlas" / "index.md").read_text(encoding="utf-8"))[1:]:
        names = re.findall(r"^\| \[`[\w-]+`\]\(([\w-]+\.md)\)", section, re.M)
        if names:
            groups[section.split("\n", 1)[0].strip()] = [f"atlas/{n}" for n in names]
    return groups


def test_the_menu_groups_the_atlas_by_family():
    """The menu lists the atlas's pages under the families of its overview, in the same order, not as one list of 41."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    reference = next(item["Reference"] for item in nav if isinstance(item, dict) and "Reference" in item)
    atlas = next(item["Loss atlas"] for item in reference if isinstance(item, dict) and "Loss atlas" in item)
    menu = {k: [next(iter(p.values())) for p in v] for item in atlas if isinstance(item, dict)
            for k, v in item.items() if isinstance(v, list)}
    groups = _atlas_groups()
    assert len(groups) >= 5 and sum(map(len, groups.values())) >= 40, groups
    assert menu == groups, f"mkdocs.yml's atlas menu differs from the overview's families: {menu} vs {groups}"


def _png_size_inches(path: Path) -> tuple[float, float]:
    """(width in inches, dpi) of a PNG from its IHDR and pHYs chunks (matplotlib writes the figure's dpi there)."""
    data, i, width, dpi = path.read_bytes(), 8, 0, 0.0
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        kind, body = data[i + 4 : i + 8], data[i + 8 : i + 8 + n]
        if kind == b"IHDR":
            width = int.from_bytes(body[:4], "big")
        elif kind == b"pHYs" and body[8] == 1:  # unit: metre
            dpi = int.from_bytes(body[:4], "big") * 0.0254
        i += 12 + n
    return (width / dpi if dpi else float("inf")), dpi


RESULT_FIGURE_INCHES = 8.5  # the docs' column shows ~690 px at 1280 px: 9-pt text of an 8.5-in figure is >= 9 px


def test_result_plots_are_drawn_for_the_column():
    """A results figure drawn wider than the column is shrunk to fit it, and its text with it (nsample.png was 14 in
    wide at 100 dpi: 7-pt text at about 6 px): each is at most 8.5 in wide, at 2 × 96 dpi or more for sharp text."""
    bad = []
    for png in sorted((DOCS / "results").glob("*.png")):
        inches, dpi = _png_size_inches(png)
        if inches > RESULT_FIGURE_INCHES or dpi < 150:
            bad.append(f"{png.name}: {inches:.1f} in at {dpi:.0f} dpi")
    assert not bad, f"results figures too wide for the column or too coarse: {bad}"
