"""`make docs-check`'s browser check catches what a reader would see broken (skipped where
Chromium is not installed: `apt-get install chromium`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import docs_check
import pytest

PIXEL_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'


def _page(title: str, body: str) -> str:
    return f'<html><head><title>{title}</title><link rel="icon" href="dot.svg"></head><body><article><h1>{title}</h1>{body}</article></body></html>'


@pytest.fixture(scope="module")
def browser():
    chromium = next(
        (
            shutil.which(n)
            for n in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(n)
        ),
        None,
    )
    if chromium is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        devtools = docs_check.DevTools(chromium, Path(profile))
        yield devtools
        devtools.close()


def test_a_page_that_renders_passes_and_is_screenshotted(browser, tmp_path):
    (tmp_path / "dot.svg").write_text(PIXEL_SVG)
    (tmp_path / "good.html").write_text(
        _page("Good", '<pre><code>make docs</code></pre><img src="dot.svg">')
    )
    with docs_check.serve(tmp_path) as root:
        report = docs_check.check_page(
            browser, "good", root + "good.html", "Good", 1, tmp_path / "good.png"
        )
    assert report.problems == []
    assert report.facts["code_blocks"] == 2  # the <pre> and its <code>
    assert (tmp_path / "good.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_broken_page_is_reported_with_each_fault(browser, tmp_path):
    (tmp_path / "dot.svg").write_text(PIXEL_SVG)
    body = '<img src="missing.png"><script>console.error("boom"); undefinedFunction();</script>'
    (tmp_path / "bad.html").write_text(_page("Broken", body))
    with docs_check.serve(tmp_path) as root:
        report = docs_check.check_page(
            browser, "bad", root + "bad.html", "Wanted", 2, tmp_path / "bad.png"
        )
    problems = "\n".join(report.problems)
    assert "lacks 'Wanted'" in problems
    assert "no code block" in problems
    assert "1 images in the page's content, not 2" in problems
    assert "image not loaded: " in problems and "missing.png" in problems
    assert "console.error: boom" in problems
    assert "uncaught exception: ReferenceError: undefinedFunction is not defined" in problems
