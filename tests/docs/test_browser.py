"""A headless-Chromium test of the built site: pages load without a script error, every formula is typeset,
no request fails (a missing image, script or font), and the search index loads; at a desktop (1280 px) and a phone
(390 px) width, no page scrolls sideways, no formula or code block is wider than the column, and no raw TeX shows in
the menu or the table of contents.

Skipped where no Chromium is installed (Debian: ``apt-get install chromium``). ``PREFZOO_SCREENSHOTS=DIR`` also saves
each page at desktop (1280 px) and phone (390 px) width.
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
PAGES = ("", "atlas/", "atlas/dpo/", "atlas/kto/", "losses/", "theory/", "results/performance/")
# pages whose layout is measured at each width: long formulas, wide tables and code, generated pages
LAYOUT_PAGES = ("", "modifiers/", "theory/", "architecture/", "cli/", "losses/length-aware/", "properties/", "atlas/",
                "atlas/mmpo/", "results/performance/", "results/beta-sweep/", "api/prefzoo/")
WIDTHS = {"desktop": 1280, "phone": 390}
LAYOUT_JS = Path(__file__).with_name("layout.js").read_text(encoding="utf-8")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium installed: the browser smoke test needs one "
                                "(apt-get install chromium)")


class _Server:
    """The site over HTTP on a free local port, recording every request's path and status."""

    def __init__(self, root: Path) -> None:
        self.requests: list[tuple[str, int]] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                server.requests.append((self.path, int(code) if str(code).isdigit() else 0))

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = server.layout_page(root, self.path)
                if body is None:
                    return super().do_GET()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @staticmethod
    def layout_page(root: Path, path: str) -> bytes | None:
        """``/__layout/PAGE``: PAGE in one iframe per width of WIDTHS (Chromium's headless window is at least 500 px
        wide, and one load measures both); ``PAGE?layout``: the page with tests/docs/layout.js added. None for every
        other path (served as files)."""
        if m := re.fullmatch(r"/__layout/(.*)", path):
            frames = "".join(f'<iframe src="/{m.group(1)}?layout" style="display:block;width:{w}px;height:2400px;'
                             f'border:0"></iframe>' for w in WIDTHS.values())
            return f'<!DOCTYPE html><html><body style="margin:0">{frames}</body></html>'.encode()
        page, _, query = path.partition("?")
        file = root / page.lstrip("/")
        file = file / "index.html" if file.is_dir() else file
        if query != "layout" or file.suffix != ".html" or not file.is_file():
            return None
        script = f"<script>{LAYOUT_JS}</script></body>".encode()
        return file.read_bytes().replace(b"</body>", script, 1)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def serve() -> Iterator[functools.partial[_Server]]:
    servers: list[_Server] = []

    def start(root: Path) -> _Server:
        servers.append(_Server(root))
        return servers[-1]

    yield start  # type: ignore[misc]
    for s in servers:
        s.close()


def load(url: str, *extra: str) -> tuple[str, str]:
    """(the DOM after scripts ran, Chromium's log) for ``url``."""
    out = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=8000", *extra, "--dump-dom", url],
        capture_output=True, text=True, timeout=90,
    )
    return out.stdout, out.stderr


def problems(dom: str, log: str) -> list[str]:
    """Script errors in the log and formulas the page left un-typeset (or typeset as an error)."""
    found = [line.split("CONSOLE", 1)[1][:200] for line in log.splitlines()
             if "CONSOLE" in line and re.search(r"Uncaught|Error", line)]
    math = dom.count('class="arithmatex"')
    typeset = len(re.findall(r'class="arithmatex">(?:<span>)?<span class="katex', dom))
    if typeset < math:
        found.append(f"{math - typeset} of {math} formulas not typeset")
    if "katex-error" in dom:
        found.append("KaTeX reported an error: " + dom.split("katex-error", 1)[1][:120])
    return found


def test_pages_load_typeset_and_request_nothing_missing(site, serve, tmp_path):
    server = serve(site)
    shots = os.environ.get("PREFZOO_SCREENSHOTS")
    for page in PAGES:
        dom, log = load(server.url + page)
        assert "md-content" in dom, f"/{page} did not load"
        assert not problems(dom, log), f"/{page}: {problems(dom, log)}"
        if shots:
            for name, width in (("desktop", 1280), ("phone", 390)):
                path = Path(shots) / f"{page.strip('/').replace('/', '-') or 'home'}-{name}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                load(server.url + page, f"--window-size={width},1800", f"--screenshot={path}")
    failed = sorted({p for p, code in server.requests if code >= 400})
    assert not failed, f"requests that failed (a missing image, script or font?): {failed}"
    assert any(p.startswith("/search/search_index.json") for p, code in server.requests), "search index not loaded"
    if (site / "atlas" / "dpo" / "index.html").is_file():
        assert sum(1 for p, _ in server.requests if p.endswith((".svg", ".png"))) >= 3, "the atlas's images"


def test_the_smoke_test_sees_a_broken_formula_and_a_missing_image(site, serve, tmp_path):
    (tmp_path / "assets").mkdir()
    shutil.copytree(site / "assets" / "katex", tmp_path / "assets" / "katex")
    shutil.copytree(site / "assets" / "javascripts", tmp_path / "assets" / "javascripts")
    (tmp_path / "index.html").write_text(
        '<!DOCTYPE html><html><head><link rel="stylesheet" href="assets/katex/katex.min.css"></head><body>'
        '<div class="md-content">'
        '<span class="arithmatex">\\(\\frac{1}{\\)</span><span class="arithmatex">\\(x^2\\)</span>'
        '<img src="nope.png" alt="a missing image"></div>'
        '<script src="assets/katex/katex.min.js"></script><script src="assets/katex/contrib/auto-render.min.js">'
        '</script><script src="assets/javascripts/katex-init.js"></script></body></html>', encoding="utf-8")
    server = serve(tmp_path)
    dom, log = load(server.url)
    found = problems(dom, log)
    assert "1 of 2 formulas not typeset" in found, found  # the good formula beside it is typeset
    assert ("/nope.png", 404) in server.requests
    assert problems('<div class="arithmatex">\\[x\\]</div>', "") == ["1 of 1 formulas not typeset"]


def layout(url: str, page: str) -> dict[int, dict]:
    """What tests/docs/layout.js measured on ``page`` at each width of WIDTHS: {frame width: measurements}."""
    dom, log = load(f"{url}__layout/{page}", "--window-size=1400,5000")
    found = [json.loads(html.unescape(m)) for m in re.findall(r'<pre id="prefzoo-layout">(.*?)</pre>', dom, re.S)]
    by_width = {m["frame"]: m for m in found}
    assert sorted(by_width) == sorted(WIDTHS.values()), f"/{page}: measured {sorted(by_width)} ({log[-300:]})"
    return by_width


def layout_problems(m: dict, width: int) -> list[str]:
    """What a reader at ``width`` px would see wrong: the page scrolling sideways, a formula or (at desktop width) a
    code block wider than the column, raw TeX in the menu or the table of contents."""
    found = []
    if m["scroll_width"] > m["viewport"] + 1:
        found.append(f"the page scrolls sideways ({m['scroll_width']} px wide in a {m['viewport']} px viewport)")
    found += [f"inline formula past the column's edge: {f['tex']!r}" for f in m["wide_inline"]]
    if width >= 1000:
        found += [f"formula wider than the column ({f['width']} > {f['box']} px): {f['tex']!r}"
                  for f in m["wide_formulas"]]
        found += [f"code block wider than the column ({c['width']} > {c['box']} px): {c['first_line']!r}"
                  for c in m["wide_code"]]
    found += [f"raw TeX in the menu or table of contents: {t!r}" for t in m["tex_in_nav"]]
    return found


def test_pages_fit_a_desktop_and_a_phone(site, serve):
    """At 1280 and 390 px: nothing scrolls the page sideways, no formula or code block needs scrolling on a desktop
    (a phone may scroll a wide formula or code block inside its own box), no raw TeX in the menu."""
    server = serve(site)
    found = []
    for page in LAYOUT_PAGES:
        if not (site / page / "index.html").is_file():
            continue
        measured = layout(server.url, page)
        for name, width in WIDTHS.items():
            found += [f"/{page} ({name}, {width} px): {p}" for p in layout_problems(measured[width], width)]
    assert not found, "layout problems:\n" + "\n".join(found)


def test_the_layout_check_sees_what_it_must(site, serve, tmp_path):
    """A page with a long inline formula, a formula and a code block wider than the column, and TeX in a heading
    (so in the table of contents): each is reported, at the width where a reader sees it."""
    for rel in ("assets", "search"):
        shutil.copytree(site / rel, tmp_path / rel)
    wide = " + ".join(f"x_{{{i}}}" for i in range(60))
    page = (site / "modifiers" / "index.html").read_text(encoding="utf-8")
    head, _, rest = page.partition('<article class="md-content__inner md-typeset">')
    body = (f'<a class="md-nav__link" href="#t">The identity \\(-s_w\\)</a>'
            f'<p>inline <span class="arithmatex">\\({{{wide}}}\\)</span></p>'
            f'<div class="arithmatex">\\[{wide} = y\\]</div><pre><code>{"x" * 300}</code></pre>')
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "index.html").write_text(
        head + '<article class="md-content__inner md-typeset">' + body + "</article>"
        + rest.split("</article>", 1)[1], encoding="utf-8")
    server = serve(tmp_path)
    measured = layout(server.url, "bad/")
    desktop, phone = (layout_problems(measured[w], w) for w in (WIDTHS["desktop"], WIDTHS["phone"]))
    assert any("formula wider than the column" in p for p in desktop), desktop
    assert any("code block wider than the column" in p for p in desktop), desktop
    assert any("scrolls sideways" in p for p in phone) or any("inline formula" in p for p in phone), phone
    assert any("inline formula past the column's edge" in p for p in phone), phone
    assert any("raw TeX in the menu" in p for p in desktop), desktop
