"""mkdocs hooks (mkdocs.yml `hooks:`): the site's home page is README.md, rewritten for the site when it is built.

README.md links into the repository (``docs/losses.md``, ``plugins/prefzoo-caldpo``); on the site those pages
live one level up, so :func:`home_page` rewrites the links and nothing is copied by hand.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# README link target prefix -> the site page it becomes (a folder of the repo that is not on the site: a guide)
LINK_PREFIXES = {"docs/": "", "plugins/": "plugin-guide.md"}


CODE_WIDTH = 78  # characters a code box shows on the site without scrolling (desktop, 1280 px)


def _options(line: str, width: int) -> str:
    """A long command broken before its ``--options`` with backslashes, each line at most ``width`` where it can."""
    words = re.split(r" (?=--)", line)
    out = [words[0]]
    for w in words[1:]:
        if len(out[-1]) + 1 + len(w) + 2 > width:
            out.append("    " + w)
        else:
            out[-1] += " " + w
    return " \\\n".join(out)


def wrap_commands(markdown: str, width: int = CODE_WIDTH) -> str:
    """Shell lines in ```bash blocks longer than ``width`` read without scrolling sideways: a trailing comment goes on
    the line above, comments wrap, and a command breaks before each `` && `` (else before its ``--options``) with a
    backslash: the same command (README keeps its one-line commands, which copy-paste as they are)."""

    def fix(m: re.Match[str]) -> str:
        lines = []
        for line in m.group(2).split("\n"):
            if len(line) > width and (c := re.match(r"^(\S.*?\S)\s{2,}(# .*)$", line)):
                lines.append("\n".join(textwrap.wrap(c.group(2), width, subsequent_indent="# ")))
                line = c.group(1)
            if len(line) > width and line.startswith("# "):
                line = "\n".join(textwrap.wrap(line, width, subsequent_indent="# "))
            elif len(line) > width and " && " in line:
                line = " \\\n    && ".join(line.split(" && "))
            elif len(line) > width and " --" in line:
                line = _options(line, width)
            lines.append(line)
        return m.group(1) + "\n".join(lines) + m.group(3)

    return re.sub(r"(```bash\n)(.*?)(\n```)", fix, markdown, flags=re.S)


def home_page(readme: str) -> str:
    """README.md as the site's index.md: ``](docs/X)`` becomes ``](X)``, ``](plugins/...)`` the plugin guide, and long
    shell lines are wrapped (:func:`wrap_commands`)."""

    def fix(m: re.Match[str]) -> str:
        target = m.group(1)
        for prefix, page in LINK_PREFIXES.items():
            if target.startswith(prefix):
                return f"]({page or target[len(prefix):]})"
        return m.group(0)

    return wrap_commands(re.sub(r"\]\(([^)#][^)]*)\)", fix, readme))


def package_version() -> str:
    """pyproject.toml's ``version``: the site's footer names the version it documents."""
    m = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    return m.group(1) if m else "unknown"


def on_config(config: Any) -> Any:
    config["copyright"] = f"prefzoo {package_version()} · Apache-2.0"
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=home_page(readme)))
    return files


def outside_links(markdown: str, page_dir: Path, docs_dir: Path) -> str:
    """Links from a docs page to a repository file outside docs/ (``../examples/x.py``) work on GitHub but not on
    the site: there the link text stays and the target is named as a repository path. A target that does not exist
    is left alone, so ``mkdocs build --strict`` still reports it."""

    def fix(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        if "://" in target or target.startswith(("#", "/", "mailto:")):
            return m.group(0)
        path = (page_dir / target.split("#")[0]).resolve()
        if path.is_relative_to(docs_dir.resolve()) or not path.exists() or not path.is_relative_to(ROOT):
            return m.group(0)
        rel = path.relative_to(ROOT).as_posix()
        return text if text.strip("`") == rel else f"{text} (repository file `{rel}`)"

    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", fix, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.generated_by or page.file.src_uri == "index.md":
        return markdown
    src = Path(page.file.abs_src_path)
    return wrap_commands(outside_links(markdown, src.parent, Path(config["docs_dir"])))


SPHINX_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):(?=<code>)")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings cite names Sphinx-style (``:class:`Shape```); mkdocstrings renders the name as code: drop the role."""
    return SPHINX_ROLE.sub("", html)


# TeX commands the search results show as the character they print (the rest lose their backslash)
TEX_SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "varepsilon": "ε", "epsilon": "ε",
    "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "psi": "ψ",
    "nabla": "∇", "partial": "∂", "sum": "Σ", "prod": "Π", "cdot": "·", "times": "×", "leftarrow": "←",
    "rightarrow": "→", "to": "→", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
    "approx": "≈", "equiv": "≡", "infty": "∞", "ell": "ℓ", "mid": "|", "lvert": "|", "rvert": "|", "in": "∈",
    "lfloor": "⌊", "rfloor": "⌋", "pm": "±", "hat": "", "bar": "", "tilde": "",
    "left": "", "right": "", "bigl": "", "bigr": "", "Bigl": "", "Bigr": "", "quad": " ", "qquad": " ",
}  # fmt: skip
MATH_SPAN = re.compile(r"\\\((.*?)\\\)|\\\[(.*?)\\\]", re.S)


def plain_math(tex: str) -> str:
    """A formula as the search results show it: ``\\frac{a}{b}`` as (a)/(b), ``\\rho_w`` as ρ_w, no backslashes."""
    for _ in range(3):  # nested groups, innermost first
        tex = re.sub(r"\\(?:mathrm|operatorname|text|mathit|mathbf|boldsymbol)\{([^{}]*)\}", r"\1", tex)
        tex = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", tex)
    tex = re.sub(r"\\([A-Za-z]+)", lambda m: TEX_SYMBOLS.get(m.group(1), m.group(1) + " "), tex)
    tex = re.sub(r"\\\\|\\[,;:! ]|&amp;|&", " ", tex)
    return " ".join(tex.replace("{", "").replace("}", "").replace("\\", "").split())


def search_text(text: str) -> str:
    """A search entry's title or text with its formulas as plain text (the index holds them as raw TeX)."""
    return MATH_SPAN.sub(lambda m: plain_math(m.group(1) if m.group(1) is not None else m.group(2)), text)


def on_post_build(config: Any) -> None:
    """The search index without raw TeX: the results list shows ρ_w − ρ_l, not ``\\(\\rho_w - \\rho_l\\)``."""
    path = Path(config["site_dir"]) / "search" / "search_index.json"
    if not path.is_file():
        return
    index = json.loads(path.read_text(encoding="utf-8"))
    for doc in index.get("docs", []):
        doc["title"], doc["text"] = search_text(doc.get("title", "")), search_text(doc.get("text", ""))
    path.write_text(json.dumps(index, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
