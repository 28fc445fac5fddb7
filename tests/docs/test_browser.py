"""A headless-Chromium smoke test of the built site: pages load without a script error, every formula is typeset,
no request fails (a missing image, script or font), and the search index loads.

Skipped where no Chromium is installed (Debian: ``apt-get install chromium``). ``PREFZOO_SCREENSHOTS=DIR`` also saves
each page at desktop (1280 px) and phone (390 px) width.
"""

from __future__ import annotations

import functools
import http.server
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

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

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
