// Typesets the math that pymdownx.arithmatex (generic mode) leaves as \( \) and \[ \] in .arithmatex elements, with
// the KaTeX bundled under assets/katex (no CDN: the site works offline). document$ re-runs it on instant navigation.
function prefzooRenderMath(root) {
  root.querySelectorAll(".arithmatex").forEach(function (el) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(function () { prefzooRenderMath(document); });
} else {
  document.addEventListener("DOMContentLoaded", function () { prefzooRenderMath(document); });
}
