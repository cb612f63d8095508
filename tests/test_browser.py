"""The built book in a real browser: headless Chromium, driven by Playwright.

Chromium is Debian's package (`make install` installs it where it can), not a browser that a
test tool downloads; `CHROMIUM` names another binary. Every page of the table of contents is
opened from disk at a laptop's window width and at a phone's, and must show:

* its charts rendered by vega-embed (an SVG or canvas in every chart's box);
* no script error, and nothing logged as an error in the console;
* every formula typeset by MathJax, without a TeX error;
* no code block, or printed output, wider than its column, and at the laptop's width no
  chart either (on a phone a wide chart scrolls sideways in its box);
* no request to anything but the book's own files: the test refuses every other request
  and fails on it.

With `ANNOTATED_SCREENSHOTS=FOLDER`, a picture of every chart at the laptop's width is saved
there, named after its page.
"""

import os
import shutil
from pathlib import Path

import pytest

from helpers import toc_files

playwright = pytest.importorskip("playwright.sync_api")

WINDOWS = {"laptop": (1280, 900), "phone": (412, 915)}
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]

RENDERED = """() => [...document.querySelectorAll('.vega-chart')]
    .every(box => box.querySelector('svg, canvas'))"""
TYPESET = """() => !document.querySelector('.math')
    || (window.MathJax && MathJax.startup && MathJax.startup.promise.then(() => true))"""
UNTYPESET = """() => [...document.querySelectorAll('span.math, div.math')]
    .filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 60))"""
TEX_ERRORS = "() => document.querySelectorAll('mjx-merror').length"
TOO_WIDE = """() => [...document.querySelectorAll('pre')]
    .filter(p => p.offsetParent !== null)
    .filter(p => p.scrollWidth > p.clientWidth + 1
                 || p.getBoundingClientRect().right > window.innerWidth + 1)
    .map(p => p.textContent.split('\\n')[0].slice(0, 60))"""
WIDE_CHARTS = """() => {
    const column = document.querySelector('main article').getBoundingClientRect().right;
    return [...document.querySelectorAll('.vega-chart svg, .vega-chart canvas')]
        .filter(c => c.getBoundingClientRect().right > column + 1)
        .map(c => c.closest('.vega-chart').id);
}"""


def chromium() -> str:
    found = os.environ.get("CHROMIUM") or shutil.which("chromium")
    assert found, (
        "The browser test needs Chromium, and none was found. On Debian or Ubuntu, "
        "`apt-get install chromium` (make install does this as root); elsewhere set "
        "CHROMIUM to a Chromium or Chrome binary."
    )
    return found


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium(), args=FLAGS)
        yield launched
        launched.close()


def open_page(browser, url: str, window: tuple[int, int]):
    """Open `url`, refusing requests that leave the book's folder; returns the page and the
    lists that collect its problems."""
    width, height = window
    page = browser.new_page(viewport={"width": width, "height": height})
    outside, errors = [], []

    def route(request_route):
        url = request_route.request.url
        if url.startswith("file://"):
            request_route.continue_()
        else:
            outside.append(url)
            request_route.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: errors.append(f"script error: {e}"))
    page.on("console", lambda m: m.type == "error" and errors.append(f"console: {m.text}"))
    page.goto(url, wait_until="load")
    return page, outside, errors


@pytest.mark.parametrize("window", sorted(WINDOWS))
@pytest.mark.parametrize("name", toc_files())
def test_page_in_a_browser(browser, built_book, name, window):
    page, outside, errors = open_page(
        browser, (built_book / f"{name}.html").as_uri(), WINDOWS[window]
    )
    try:
        page.wait_for_function(RENDERED, timeout=30_000)
        page.wait_for_function(TYPESET, timeout=30_000)
        assert page.evaluate(UNTYPESET) == [], "math left as TeX source"
        assert page.evaluate(TEX_ERRORS) == 0, "MathJax could not typeset a formula"
        assert page.evaluate(TOO_WIDE) == [], f"code wider than its column at {window} width"
        if window == "laptop":  # on a phone a chart may scroll sideways in its box
            assert page.evaluate(WIDE_CHARTS) == [], "a chart wider than the page's column"
        assert not outside, f"requests that left the machine: {outside}"
        assert not errors, errors
        if window == "laptop":
            save_charts(page, name)
    finally:
        page.close()


def save_charts(page, name: str) -> None:
    folder = os.environ.get("ANNOTATED_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for i, chart in enumerate(page.locator(".vega-chart").all()):
        chart.screenshot(path=str(Path(folder) / f"{Path(name).name}-{i}.png"))
