// Layout measurements of one page of the built site, for tests/docs/test_browser.py: the test's server adds this
// script to a page it serves inside an <iframe> of the width under test, and the script writes what it measured
// into the parent page as <pre id="prefzoo-layout">JSON</pre> (read from Chromium's --dump-dom).
(function () {
  "use strict";
  function scrollsInOwnBox(el, column) {
    for (let box = el; box && box !== column; box = box.parentElement) {
      const x = getComputedStyle(box).overflowX;
      if (x === "auto" || x === "scroll") return true;
    }
    return false;
  }
  function measure() {
    const column = document.querySelector(".md-content__inner") || document.body;
    const col = column.getBoundingClientRect();
    const doc = document.documentElement;
    const out = {frame: window.innerWidth, viewport: doc.clientWidth, scroll_width: doc.scrollWidth, column: Math.round(col.width),
                 wide_formulas: [], wide_inline: [], wide_code: [], tex_in_nav: [], images: []};
    for (const el of column.querySelectorAll("div.arithmatex")) {
      if (el.scrollWidth > el.clientWidth + 1) {
        const tex = (el.querySelector("annotation") || el).textContent.trim().slice(0, 70);
        out.wide_formulas.push({tex: tex, width: el.scrollWidth, box: el.clientWidth});
      }
    }
    for (const el of column.querySelectorAll("span.arithmatex")) {
      const r = el.getBoundingClientRect();
      if ((r.right > col.right + 1 || r.width > col.width + 1) && !scrollsInOwnBox(el.parentElement, column)) {
        const tex = (el.querySelector("annotation") || el).textContent.trim().slice(0, 70);
        out.wide_inline.push({tex: tex, right: Math.round(r.right), column_right: Math.round(col.right)});
      }
    }
    for (const el of column.querySelectorAll("pre > code")) {
      if (el.scrollWidth > el.clientWidth + 1) {
        out.wide_code.push({first_line: el.textContent.split("\n")[0].slice(0, 60), width: el.scrollWidth,
                            box: el.clientWidth, scrolls: scrollsInOwnBox(el, column)});
      }
    }
    for (const a of document.querySelectorAll(".md-nav__link, .md-header__topic, title")) {
      const text = a.textContent.replace(/\s+/g, " ").trim();
      if (/\\[()[\]]|\$/.test(text)) out.tex_in_nav.push(text.slice(0, 80));
    }
    for (const img of column.querySelectorAll("img")) {
      out.images.push({src: img.getAttribute("src"), shown: Math.round(img.getBoundingClientRect().width),
                       natural: img.naturalWidth});
    }
    const pre = parent.document.createElement("pre");
    pre.id = "prefzoo-layout";
    pre.textContent = JSON.stringify(out);
    parent.document.body.appendChild(pre);
  }
  window.addEventListener("load", function () { setTimeout(measure, 1000); });
})();
