"""The documentation site as a reader sees it: pages loaded in headless Chromium, checked, and
screenshotted (`make docs-check`, after `make docs`).

The built site is served on 127.0.0.1 (a free port) by a thread of this process; Chromium
(`apt-get install chromium`) runs headless with a fresh profile and is driven through the
DevTools protocol over `--remote-debugging-pipe` (file descriptors 3 and 4: no network port,
no client library). For each page it checks that:

- the page has its title (`<title>` and the first `<h1>`);
- it shows at least one code block;
- every image on it loaded (`complete` with a natural width), and there is at least one;
- nothing was logged as an error: no console error, no uncaught exception, no failed request;

then writes a full-width screenshot to `--screenshots/<name>.png`. Exit status 1 if a page
fails, with what failed.

    python scripts/docs_check.py --site site --screenshots docs/screenshots
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# name -> (path in the site, text its title must contain, images its content must show):
# the home page, a guide, an API page and a credit-map page. Every page also shows the logo.
PAGES = {
    "home": ("", "mrtpo", 1),
    "guide-custom-task": ("guides/custom-task/", "Your own task and verifiers", 0),
    "api-advantages": ("reference/api/advantages/", "mrtpo.advantages", 0),
    "credit-map": ("credit-maps/tool_calling-0/", "A tool call after the cold start", 1),
}
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)
WIDTH, HEIGHT = 1280, 900
PAGE_TIMEOUT_S = 30.0

# What the page shows, read in the page once it has loaded (images lazily loaded are scrolled
# into view first, so that "every image loaded" means every one).
INSPECT = """
(async () => {
  for (const image of document.images) { image.loading = "eager"; }
  await Promise.all([...document.images].map(image => image.complete ? null :
    new Promise(done => { image.onload = image.onerror = done; })));
  const h1 = document.querySelector("article h1, h1");
  return {
    title: document.title,
    h1: h1 ? h1.textContent.trim() : "",
    code_blocks: document.querySelectorAll("pre code, pre").length,
    content_images: document.querySelectorAll("article img").length,
    images: [...document.images].map(i => ({src: i.src, loaded: i.complete && i.naturalWidth > 0})),
    height: Math.ceil(document.documentElement.scrollHeight),
  };
})()
"""


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("no Chromium found on PATH: apt-get install chromium")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


@contextlib.contextmanager
def serve(site: Path) -> Iterator[str]:
    """The built site on http://127.0.0.1:PORT/ while the block runs."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _above_four(fd: int) -> int:
    """`fd` moved to a descriptor number above 4 (the original closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class DevTools:
    """A Chromium driven over --remote-debugging-pipe: JSON messages, NUL-terminated, written
    to its fd 3 and read from its fd 4."""

    def __init__(self, chromium: str, profile: Path) -> None:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # The child's ends above fd 4, so that putting them on 3 and 4 overwrites neither.
        to_browser_read, from_browser_write = (
            _above_four(to_browser_read),
            _above_four(from_browser_write),
        )
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}"]
        # bash puts the pipes on fds 3 and 4, where Chromium expects them (dash reads only
        # one-digit descriptors in a redirection).
        command = f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write}'
        self.process = subprocess.Popen(
            ["bash", "-c", command, chromium, *flags, "about:blank"],
            pass_fds=(to_browser_read, from_browser_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe (exit {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> None:
        """Until event `method` of `session` arrives (kept events count)."""
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while not any(
            e.get("method") == method and e.get("sessionId") == session for e in self.events
        ):
            self.events.append(self._read_message(deadline))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self._to_browser)
        os.close(self._from_browser)


@dataclass
class PageReport:
    name: str
    url: str
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


def _errors(events: list[dict[str, Any]], session: str) -> list[str]:
    """The console errors, uncaught exceptions and failed loads of one page."""
    errors = []
    for event in events:
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            errors.append(f"uncaught exception: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(
                f"{entry.get('source', 'log')}: {entry.get('text', '')} {entry.get('url', '')}"
            )
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            errors.append(
                f"failed request: {params.get('errorText', '')} ({params.get('type', '')})"
            )
    return errors


def check_page(
    browser: DevTools, name: str, url: str, title: str, content_images: int, screenshot: Path
) -> PageReport:
    report = PageReport(name, url)
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(f"{domain}.enable", session)
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=WIDTH,
        height=HEIGHT,
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.call("Page.navigate", session, url=url)
    browser.wait_for("Page.loadEventFired", session)
    facts = browser.call(
        "Runtime.evaluate", session, expression=INSPECT, awaitPromise=True, returnByValue=True
    )["result"]["value"]
    report.facts = facts
    if title not in facts["title"] or title not in facts["h1"]:
        report.problems.append(f"title {facts['title']!r} / h1 {facts['h1']!r} lacks {title!r}")
    if facts["code_blocks"] < 1:
        report.problems.append("no code block")
    if not facts["images"]:
        report.problems.append("no image")
    if facts["content_images"] < content_images:
        report.problems.append(
            f"{facts['content_images']} images in the page's content, not {content_images}"
        )
    report.problems += [f"image not loaded: {i['src']}" for i in facts["images"] if not i["loaded"]]
    time.sleep(0.5)  # late console messages of the page's scripts
    with contextlib.suppress(TimeoutError):
        browser.call("Runtime.evaluate", session, expression="1")  # drains pending events
    report.problems += _errors(browser.events, session)
    # The whole page in one viewport (the theme fades its tabs out on a scrolled page), then
    # a pause for the theme's transitions to end.
    height = min(max(int(facts["height"]), HEIGHT), 4000)
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=WIDTH,
        height=height,
        deviceScaleFactor=1,
        mobile=False,
    )
    time.sleep(1.0)
    shot = browser.call("Page.captureScreenshot", session, format="png")
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    browser.call("Target.closeTarget", targetId=target)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default="site", help="the built site (make docs)")
    parser.add_argument("--screenshots", default="docs/screenshots", help="where the PNGs go")
    parser.add_argument("--chromium", default=None, help="the browser (default: on PATH)")
    args = parser.parse_args(argv)
    site, shots = Path(args.site), Path(args.screenshots)
    if not (site / "index.html").is_file():
        raise SystemExit(f"--site {site} holds no built site (index.html): run make docs first")
    shots.mkdir(parents=True, exist_ok=True)
    chromium = args.chromium or find_chromium()
    reports = []
    with serve(site) as root, tempfile.TemporaryDirectory(prefix="docs-check-") as profile:
        browser = DevTools(chromium, Path(profile))
        try:
            for name, (path, title, images) in PAGES.items():
                shot = shots / f"{name}.png"
                reports.append(check_page(browser, name, root + path, title, images, shot))
        finally:
            browser.close()
    for report in reports:
        status = "ok" if not report.problems else "FAILED"
        facts = report.facts
        print(
            f"{status:6} {report.name}: title {facts.get('title', '')!r}, "
            f"{facts.get('code_blocks', 0)} code blocks, {len(facts.get('images', []))} images "
            f"-> {shots / (report.name + '.png')}"
        )
        for problem in report.problems:
            print(f"       {problem}")
    failed = [r.name for r in reports if r.problems]
    print(f"{len(reports) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
