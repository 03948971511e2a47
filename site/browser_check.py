"""Open every page of the built book in headless Chromium and check what a reader would get.

Why this exists: ``mkdocs build --strict`` proves that links resolve, not that a page renders, that
its figure loads, or that it works on a machine with no internet. This script serves build/site/
on 127.0.0.1, opens every page, and fails unless

- every page logs no console error and requests nothing but 127.0.0.1, localhost or data: URLs;
- every chapter page shows its title, its figures (an <img> that loaded: naturalWidth > 0) and its
  one numbers table (build/book.json, written by build_book.py, says what each chapter must show).

It saves screenshots of every page, whole, in build/site-screenshots/ (a long page in tiles of
TILE pixels). It drives Chromium through the DevTools protocol over ``--remote-debugging-pipe``
(the browser reads NUL-terminated JSON on fd 3 and writes on fd 4), so it needs nothing beyond
the standard library and /usr/bin/chromium.

It checks build/site as it finds it and builds nothing: ``make site-test`` first runs
``build_book.py --fresh`` and builds the book only when build/site.stamp does not match the
inputs, so after ``make site`` it comes straight here. The stamp, when there is one, is named in
the first line of output, so a log says which build was checked.

    .venv/bin/python site/browser_check.py    # what `make site-test` runs on a current site
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import functools
import http.server
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-pipe"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
TILE = 8000  # pixels of page per screenshot
PAGE_FACTS = """(() => {
  const text = el => el ? [...el.childNodes].filter(n => !n.classList?.contains('headerlink'))
      .map(n => n.textContent).join('').trim() : '';
  const article = document.querySelector('article') || document.body;
  const claims = [...article.querySelectorAll('table')].filter(t => {
      const head = [...t.querySelectorAll('th')].map(th => th.textContent.trim());
      return ['claim', 'stated', 'measured', 'verdict'].every(c => head.includes(c)); });
  return {
    title: text(article.querySelector('h1')),
    images: [...article.querySelectorAll('img')].map(i => ({
        src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0})),
    claim_rows: claims.length ? claims[0].querySelectorAll('tbody tr').length : -1,
    claim_tables: claims.length,
  };
})()"""


class Chromium:
    """One headless browser and one tab, spoken to over the DevTools pipe."""

    def __init__(self, exe: str, profile: Path):
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Move the child's ends above fd 10 first, so that placing them on 3 and 4 cannot
        # overwrite one with the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w)]
        log = profile / "chromium.log"
        actions = [(os.POSIX_SPAWN_DUP2, high[0], 3), (os.POSIX_SPAWN_DUP2, high[1], 4),
                   (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT, 0o644),
                   (os.POSIX_SPAWN_DUP2, 1, 2)]
        argv = [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"]
        self.pid = os.posix_spawn(exe, argv, os.environ, file_actions=actions)
        for fd in (to_browser_r, from_browser_w, *high):
            os.close(fd)
        self.out, self.inp = to_browser_w, from_browser_r
        self.buf, self.next_id, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=self.session)
        self.call("Emulation.setDeviceMetricsOverride", session=self.session,
                  width=1280, height=900, deviceScaleFactor=1, mobile=False)

    def _read(self, timeout: float) -> dict | None:
        """The next message from the browser, or None if none came within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                return None
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe (see chromium.log)")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while (reply := self._read(deadline - time.monotonic())) is not None:
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)
        raise TimeoutError(f"{method}: no reply in {timeout}s")

    def settle(self, event: str, timeout: float = 30, quiet: float = 0.5) -> None:
        """Wait for ``event``, then until the browser has been silent for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        while not any(e["method"] == event for e in self.events):
            msg = self._read(deadline - time.monotonic())
            if msg is None:
                raise TimeoutError(f"no {event} in {timeout}s")
            self.events.append(msg)
        while (msg := self._read(quiet)) is not None and time.monotonic() < deadline:
            self.events.append(msg)

    def visit(self, url: str, shot: Path) -> tuple[dict, list[dict]]:
        """Load ``url``; return the page's facts and every event it caused; save a screenshot."""
        self.events = []
        self.call("Page.navigate", session=self.session, url=url)
        self.settle("Page.loadEventFired")
        facts = self.call("Runtime.evaluate", session=self.session, expression=PAGE_FACTS,
                          returnByValue=True)["result"]["value"]
        size = self.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
        height = max(1, int(size["height"]))
        # the whole page, in tiles of at most TILE pixels (a browser's one capture is bounded):
        # home.png for a short page, home-1.png, home-2.png, ... for a long one
        tiles = range(0, height, TILE)
        for n, top in enumerate(tiles, 1):
            clip = {"x": 0, "y": top, "width": 1280, "height": min(TILE, height - top),
                    "scale": 1}
            png = self.call("Page.captureScreenshot", session=self.session, format="png",
                            clip=clip, captureBeyondViewport=True)["data"]
            name = shot if len(tiles) == 1 else shot.with_name(f"{shot.stem}-{n}.png")
            name.write_bytes(base64.b64decode(png))
        facts["height"], facts["tiles"] = height, len(tiles)
        return facts, self.events

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def problems_in(events: list[dict]) -> list[str]:
    """Requests that left the machine, console errors, failed loads."""
    found, urls = [], {}
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Network.requestWillBeSent":
            url = urls[p["requestId"]] = p["request"]["url"]
            parts = urlsplit(url)
            if parts.scheme != "data" and parts.hostname not in LOCAL_HOSTS:
                found.append(f"request left the machine: {url}")
        elif m == "Network.responseReceived" and p["response"]["status"] >= 400:
            found.append(f"HTTP {p['response']['status']}: {p['response']['url']}")
        elif m == "Network.loadingFailed" and not p.get("canceled"):
            found.append(f"load failed ({p.get('errorText')}): {urls.get(p['requestId'])}")
        elif m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            found.append("console error: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            details = p["exceptionDetails"]
            found.append("uncaught exception: " + details.get("exception", {}).get(
                "description", details.get("text", "")).splitlines()[0])
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            found.append(f"console error: {p['entry']['text']} {p['entry'].get('url', '')}")
    return found


def serve(directory: Path) -> http.server.ThreadingHTTPServer:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, default=ROOT / "build" / "site")
    ap.add_argument("--book", type=Path, default=ROOT / "build" / "book.json")
    ap.add_argument("--shots", type=Path, default=ROOT / "build" / "site-screenshots")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args(argv)
    stamp = args.site.parent / "site.stamp"
    if stamp.is_file():
        built = json.loads(stamp.read_text())
        print(f"checking {args.site} built {built.get('built', '?')} from inputs sha256 "
              f"{built.get('inputs', {}).get('sha256', '?')[:12]}")
    chapters = {c["url"]: c for c in json.loads(args.book.read_text())["chapters"]}
    pages = sorted(str(p.parent.relative_to(args.site)) + "/"
                   for p in args.site.rglob("index.html"))
    pages = [("" if p == "./" else p) for p in pages]
    missing = set(chapters) - set(pages)
    args.shots.mkdir(parents=True, exist_ok=True)
    for old in args.shots.glob("*.png"):
        old.unlink()
    server = serve(args.site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    failed = [f"{url}: chapter page missing from the site" for url in sorted(missing)]
    passed = 0
    with tempfile.TemporaryDirectory(prefix="nanoserve-chromium-") as profile:
        browser = Chromium(args.chromium, Path(profile))
        try:
            for page in pages:
                name = page.strip("/").replace("/", "-") or "home"
                facts, events = browser.visit(base + page, args.shots / f"{name}.png")
                problems = problems_in(events)
                if page in chapters:
                    problems += chapter_problems(chapters[page], facts)
                status = "ok" if not problems else "FAIL"
                print(f"  {status:4} /{page}  ({len(facts['images'])} image(s), "
                      f"{facts['height']:,} px in {facts['tiles']} screenshot(s))")
                for p in problems:
                    print(f"       {p}")
                failed += [f"/{page}: {p}" for p in problems]
                passed += not problems
        finally:
            browser.close()
            server.shutdown()
    print(f"screenshots in {args.shots}")
    print(f"site-test: {passed} passed, {len(pages) - passed + len(missing)} failed")
    return 1 if failed else 0


def chapter_problems(chapter: dict, facts: dict) -> list[str]:
    found = []
    if facts["title"] != chapter["title"]:
        found.append(f"title is {facts['title']!r}, expected {chapter['title']!r}")
    if not chapter["figures"]:
        found.append("README.md shows no figure (![...](figures/<name>.png))")
    shown = {i["src"] for i in facts["images"]}
    found += [f"figure {f} is not on the page" for f in chapter["figures"]
              if f"figures/{f}" not in shown]
    found += [f"image {i['src']} did not load" for i in facts["images"] if not i["loaded"]]
    if facts["claim_rows"] < 1:
        found.append("no numbers table (claim | stated | measured | verdict) with rows")
    if facts["claim_tables"] > 1:
        found.append(f"{facts['claim_tables']} numbers tables; a chapter page shows one")
    return found


if __name__ == "__main__":
    sys.exit(main())
