"""Browser test of agl's dashboard (run by scripts/ci/browser.sh).

Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) opens each page of a running
`agl store` whose store was filled by a short `agl train` run, and checks:

- every page: it loads with HTTP 200, the console shows no error, no script throws (`pageerror`),
  no request fails and none answers 4xx/5xx; a full-page screenshot is saved;
- `/`: the h1 says Rollouts, the table has rows, the first rollout link opens a rollout page;
- `/rollouts/{id}` (that first rollout): a waterfall with span rows, collapsible span details
  (one closed one is clicked open for the screenshot `rollout.png`), and the reward;
- `/runners`: the h1 says Runners;
- `/training`: the h1 says Training, a chart, a resources table naming `policy-v…` versions;
- `/resources`: the h1 says Resources, rows naming `policy-v…` versions;
- `/governance`: the h1 says Governance, a chart, the most frequent blocked actions (`#blocked`)
  and, when the store serves the flight recorder (`--audit`), its verification (`#recorder`);
- `/governance/audit`: the flight recorder's entries (`table.audit`), and with
  `?verdict=block` only blocked ones, whose first rollout's page shows the block and its
  violation (all spans opened for the screenshot `rollout-blocked.png`);
- `live`: `/training` stays open while a second `agl train --store-url` writes into the served
  store; the finished-rollout tally (`#tally-rollouts`) must grow within 30 s through the page's
  server-sent events (`/dashboard/events`), without a navigation or reload.

Each entry of PAGES is one page (or step) and can be chosen with `--pages`. One line per check
goes to stdout (`ok  …`, `FAIL …: reason`, `skip …: reason`); the exit status is 0 only when no
check failed, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urljoin, urlparse

from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # The machine's network is closed: without these chromium's own connections fail noisily.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
LIVE_TIMEOUT_S = 30.0
SETTLE_MS = 2_000


# ---------------------------------------------------------------------------------------------
# Results and one browser tab with its error watchers
# ---------------------------------------------------------------------------------------------


class Results:
    """Prints one line per check and remembers whether any failed."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def check(self, page: str, what: str, ok: bool, why: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"ok  {page}: {what}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {page}: {what}: {why or 'no'}", flush=True)
        return ok

    def skip(self, page: str, what: str, why: str) -> None:
        self.skipped += 1
        print(f"skip {page}: {what}: {why}", flush=True)


@dataclass
class Tab:
    """A browser page with listeners that collect every console error, uncaught script error,
    failed request and 4xx/5xx response until `problems()` is called."""

    page: Page
    problems_seen: list[str] = field(default_factory=list)
    watching: bool = True
    leaving: bool = False
    navigations: int = 0

    @classmethod
    def open(cls, browser: Browser) -> "Tab":
        tab = cls(browser.new_page(viewport=VIEWPORT))
        tab.page.set_default_timeout(15_000)
        tab.page.on("console", tab._on_console)
        tab.page.on("pageerror", tab._on_pageerror)
        tab.page.on("requestfailed", tab._on_requestfailed)
        tab.page.on("response", tab._on_response)
        tab.page.on("framenavigated", tab._on_navigated)
        return tab

    def _note(self, text: str) -> None:
        if self.watching:
            self.problems_seen.append(text)

    def _on_console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            loc = msg.location or {}
            where = f" ({loc.get('url')}:{loc.get('lineNumber')})" if loc.get("url") else ""
            self._note(f"console error: {msg.text}{where}")

    def _on_pageerror(self, error: Exception) -> None:
        self._note(f"page error: {error}")

    def _on_requestfailed(self, request: Request) -> None:
        # Leaving a page on purpose cancels its event stream (`/dashboard/events`): not an error.
        if self.leaving and request.resource_type == "eventsource" and "ERR_ABORTED" in (request.failure or ""):
            return
        self._note(f"request failed: {request.method} {request.url}: {request.failure}")

    def _on_response(self, response: Response) -> None:
        if response.status >= 400:
            self._note(f"HTTP {response.status}: {response.request.method} {response.url}")

    def _on_navigated(self, frame) -> None:
        if frame == self.page.main_frame:
            self.navigations += 1

    def goto(self, url: str) -> int:
        """Loads url; returns the document's HTTP status (0 when there was no response)."""
        self.leaving = True
        try:
            response = self.page.goto(url, wait_until="load")
        finally:
            self.leaving = False
        self.settle()
        return response.status if response else 0

    def follow(self, link) -> None:
        """Clicks link (a Locator) and waits for the page it leads to."""
        self.leaving = True
        try:
            with self.page.expect_navigation(wait_until="load"):
                link.click()
        finally:
            self.leaving = False
        self.settle()

    def settle(self) -> None:
        """Lets the requests that follow `load` (the browser's favicon, scripts' fetches) finish,
        so that their errors are seen: network idle, or at most SETTLE_MS (a page with an open
        event stream is never idle)."""
        try:
            self.page.wait_for_load_state("networkidle", timeout=SETTLE_MS)
        except PlaywrightTimeoutError:
            pass

    def problems(self) -> list[str]:
        """What went wrong so far; stops watching (closing the tab aborts open event streams)."""
        self.watching = False
        return list(self.problems_seen)

    def close(self) -> None:
        self.watching = False
        self.page.close()

    # Helpers that read the rendered page without waiting: the pages are rendered by the
    # server, so after `load` an element is there or it is missing.

    def count(self, selector: str, has_text: str | None = None) -> int:
        return self.page.locator(selector, has_text=has_text).count()

    def text(self, selector: str) -> str | None:
        loc = self.page.locator(selector)
        return loc.first.inner_text() if loc.count() else None

    def shot(self, ctx: "Context", name: str) -> None:
        path = ctx.shots / name
        self.page.screenshot(path=str(path), full_page=True)


@dataclass
class Context:
    url: str
    shots: Path
    agl: str
    work: Path
    audit: bool
    browser: Browser
    results: Results
    state: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Checks shared by the pages
# ---------------------------------------------------------------------------------------------


def short(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "missing"
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def check_load(ctx: Context, tab: Tab, name: str, path: str) -> bool:
    status = tab.goto(urljoin(ctx.url, path))
    return ctx.results.check(name, f"GET {path} answers 200", status == 200, f"HTTP {status}")


def check_h1(ctx: Context, tab: Tab, name: str, word: str) -> bool:
    h1 = tab.text("h1")
    return ctx.results.check(name, f"h1 contains {word}", h1 is not None and word in h1, f"h1 is {short(h1)}")


def check_rows(ctx: Context, tab: Tab, name: str, selector: str, minimum: int = 1, has_text: str | None = None) -> int:
    n = tab.count(selector, has_text)
    what = f"{selector} has ≥ {minimum} row{'s' if minimum != 1 else ''}"
    if has_text:
        what += f" containing {has_text!r}"
    ctx.results.check(name, what, n >= minimum, f"found {n}")
    return n


def check_exists(ctx: Context, tab: Tab, name: str, selector: str) -> bool:
    n = tab.count(selector)
    return ctx.results.check(name, f"{selector} exists", n >= 1, "not found")


def check_clean(ctx: Context, tab: Tab, name: str) -> bool:
    problems = tab.problems()
    why = f"{len(problems)} problem(s):\n" + "\n".join(f"       {p}" for p in problems[:20])
    return ctx.results.check(name, "no console errors, page errors, failed requests or 4xx/5xx", not problems, why)


def finish(ctx: Context, tab: Tab, name: str, shot: str) -> None:
    """The error check, then the screenshot, then the tab is closed."""
    check_clean(ctx, tab, name)
    try:
        tab.shot(ctx, shot)
    except Exception as e:  # a screenshot that fails is a failed check, not a crash
        ctx.results.check(name, f"screenshot {shot}", False, str(e))
    tab.close()


def simple_page(path: str, word: str, shot: str, extra: Callable[[Context, Tab, str], None] | None = None):
    """An entry that loads path, checks its h1 and runs extra(ctx, tab, name)."""

    def run(ctx: Context) -> None:
        tab = Tab.open(ctx.browser)
        check_load(ctx, tab, path, path)
        check_h1(ctx, tab, path, word)
        if extra:
            extra(ctx, tab, path)
        finish(ctx, tab, path, shot)

    return run


# ---------------------------------------------------------------------------------------------
# The pages
# ---------------------------------------------------------------------------------------------


def first_rollout_href(ctx: Context) -> str | None:
    """The href of the first rollout on `/` (found by the `/` entry, or looked up here)."""
    if "rollout_href" not in ctx.state:
        page = ctx.browser.new_page()
        page.goto(urljoin(ctx.url, "/"))
        links = page.locator("table.rollouts tbody tr a[href^='/rollouts/']")
        ctx.state["rollout_href"] = links.first.get_attribute("href") if links.count() else None
        page.close()
    return ctx.state["rollout_href"]


def page_rollouts(ctx: Context) -> None:
    """`/`: the rollouts table, and its first link leads to that rollout's page."""
    name = "/"
    tab = Tab.open(ctx.browser)
    check_load(ctx, tab, name, "/")
    check_h1(ctx, tab, name, "Rollouts")
    check_rows(ctx, tab, name, "table.rollouts tbody tr")
    tab.shot(ctx, "rollouts.png")
    links = tab.page.locator("table.rollouts tbody tr a[href^='/rollouts/']")
    href = links.first.get_attribute("href") if links.count() else None
    ctx.state["rollout_href"] = href
    if ctx.results.check(name, "the first row links to /rollouts/{id}", href is not None, "no link"):
        tab.follow(links.first)
        landed = urlparse(tab.page.url).path
        h1 = tab.text("h1")
        ctx.results.check(
            name,
            "following the first rollout link opens its page",
            landed == href and h1 is not None and h1.startswith("Rollout "),
            f"landed on {landed} with h1 {short(h1)}",
        )
    check_clean(ctx, tab, name)
    tab.close()


def page_rollout(ctx: Context) -> None:
    """`/rollouts/{id}`: waterfall, span details (one clicked open), reward."""
    name = "/rollouts/{id}"
    href = first_rollout_href(ctx)
    if href is None:
        ctx.results.check(name, "a rollout to open", False, "`/` lists no rollout link")
        return
    name = href
    tab = Tab.open(ctx.browser)
    check_load(ctx, tab, name, href)
    if check_exists(ctx, tab, name, ".waterfall"):
        check_rows(ctx, tab, name, ".waterfall .span-row")
    check_rows(ctx, tab, name, "details.span")
    body = tab.text("main") or ""
    ctx.results.check(name, "the text contains 'reward'", "reward" in body, "no 'reward' in <main>")
    # The index, not a `:not([open])` locator: that one stops matching once it is open.
    index = tab.page.locator("details.span").evaluate_all("ds => ds.findIndex(d => !d.open)")
    if index >= 0:
        target = tab.page.locator("details.span").nth(index)
        target.locator("summary").click()
        opened = target.evaluate("d => d.open")
        ctx.results.check(name, "clicking a closed details.span opens it", opened, "still closed")
    else:
        ctx.results.skip(name, "clicking a closed details.span opens it", "every span is already open")
    finish(ctx, tab, name, "rollout.png")


def extra_training(ctx: Context, tab: Tab, name: str) -> None:
    check_exists(ctx, tab, name, "svg.chart")
    check_rows(ctx, tab, name, "table tr:has(td)", has_text="policy-v")


def extra_resources(ctx: Context, tab: Tab, name: str) -> None:
    check_rows(ctx, tab, name, "tr:has(td)", has_text="policy-v")


def extra_governance(ctx: Context, tab: Tab, name: str) -> None:
    check_exists(ctx, tab, name, "svg.chart")
    if check_exists(ctx, tab, name, "#blocked"):
        check_rows(ctx, tab, name, "#blocked tr:has(td)")
    if ctx.audit:
        recorder = tab.text("#recorder")
        ctx.results.check(
            name, "#recorder contains 'verified'", recorder is not None and "verified" in recorder, f"#recorder is {short(recorder)}"
        )
    else:
        ctx.results.skip(name, "#recorder contains 'verified'", "this agl store has no --audit-db")


def verdict_cells(tab: Tab) -> list[str] | None:
    """The verdict of every row of table.audit: the cell under the header `verdict`, or else
    the row's `.verdict` element. None when neither exists."""
    headers = [h.strip().lower() for h in tab.page.locator("table.audit thead th").all_inner_texts()]
    rows = tab.page.locator("table.audit tr:has(td)")
    if "verdict" in headers:
        col = headers.index("verdict")
        return [row.locator("td").nth(col).inner_text() for row in rows.all()]
    if tab.count("table.audit tr:has(td) .verdict"):
        return [row.locator(".verdict").first.inner_text() if row.locator(".verdict").count() else "" for row in rows.all()]
    return None


def page_audit(ctx: Context) -> None:
    """`/governance/audit`: the recorder's entries; `?verdict=block` keeps only blocked ones."""
    name = "/governance/audit"
    tab = Tab.open(ctx.browser)
    check_load(ctx, tab, name, name)
    check_rows(ctx, tab, name, "table.audit tr:has(td)")
    finish(ctx, tab, name, "audit.png")

    path = name + "?verdict=block"
    tab = Tab.open(ctx.browser)
    check_load(ctx, tab, path, path)
    n = check_rows(ctx, tab, path, "table.audit tr:has(td)")
    verdicts = verdict_cells(tab)
    if verdicts is None:
        ctx.results.check(path, "every row's verdict says block", False, "no 'verdict' column or .verdict cell in table.audit")
    else:
        others = sorted({" ".join(v.split()) for v in verdicts if "block" not in v.lower()})
        ctx.results.check(path, "every row's verdict says block", n > 0 and not others, f"other verdicts: {others}" if others else "no rows")
    link = tab.page.locator('table.audit a[href^="/rollouts/"]')
    href = link.first.get_attribute("href") if link.count() else None
    finish(ctx, tab, path, "audit-block.png")

    # The rollout of the first blocked action: its trace shows the block and the violation.
    # All its spans are opened for the screenshot `rollout-blocked.png` (the README's).
    name = "blocked rollout"
    if not ctx.results.check(name, "a blocked entry links to its rollout", href is not None, "no rollout link"):
        return
    tab = Tab.open(ctx.browser)
    check_load(ctx, tab, name, href)
    body = tab.text("main") or ""
    ctx.results.check(name, "its page shows the block verdict", "block" in body, short(body))
    ctx.results.check(name, "its page lists a violation with its policy", tab.count("table.violations tr:has(td)") >= 1, "no violation rows")
    tab.page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
    finish(ctx, tab, name, "rollout-blocked.png")


def tally(tab: Tab) -> int | None:
    """The number in #tally-rollouts (digits only, so `1,234` and `1 234` read as 1234)."""
    text = tab.text("#tally-rollouts")
    if text is None:
        return None
    digits = re.sub(r"\D", "", text)
    return int(digits) if digits else None


def page_live(ctx: Context) -> None:
    """`/training` refreshes its <main> from `/dashboard/events` while a run writes the store."""
    name = "live /training"
    tab = Tab.open(ctx.browser)
    streams: list[str] = []
    tab.page.on("request", lambda r: streams.append(r.url) if urlparse(r.url).path == "/dashboard/events" else None)
    if not check_load(ctx, tab, name, "/training"):
        finish(ctx, tab, name, "live.png")
        return
    before = tally(tab)
    if not ctx.results.check(name, "#tally-rollouts shows a number", before is not None, f"#tally-rollouts is {short(tab.text('#tally-rollouts'))}"):
        finish(ctx, tab, name, "live.png")
        return
    deadline = time.monotonic() + 10
    while not streams and time.monotonic() < deadline:
        tab.page.wait_for_timeout(100)
    ctx.results.check(name, "subscribes to /dashboard/events", bool(streams), "no request to /dashboard/events within 10 s")
    tab.page.evaluate("window.__aglMarker = 1")
    url_before = tab.page.url
    navigations_before = tab.navigations

    log = open(ctx.work / "live-train.log", "wb")
    cmd = [ctx.agl, "train", "--store-url", ctx.url, "--workers", "2", "--limit", "60", "--epochs", "1"]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    started = time.monotonic()
    train = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    after, grew_at = before, None
    try:
        while time.monotonic() - started < LIVE_TIMEOUT_S:
            tab.page.wait_for_timeout(250)
            now = tally(tab)
            if now is not None and now > before:
                after, grew_at = now, time.monotonic() - started
                break
        ctx.results.check(
            name,
            f"#tally-rollouts grows within {LIVE_TIMEOUT_S:.0f} s while a run writes the store",
            grew_at is not None,
            f"stayed at {before} (now {short(tab.text('#tally-rollouts'))})",
        )
        if grew_at is not None:
            print(f"     #tally-rollouts {before} → {after} after {grew_at:.1f} s", flush=True)
        marker = tab.page.evaluate("window.__aglMarker")
        ctx.results.check(
            name,
            "updated in place (same URL, no navigation, window marker kept)",
            marker == 1 and tab.page.url == url_before and tab.navigations == navigations_before,
            f"marker {marker!r}, url {tab.page.url}, {tab.navigations - navigations_before} navigation(s)",
        )
        code = train.wait(timeout=180)
    except subprocess.TimeoutExpired:
        train.kill()
        code = train.wait()
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
        log.close()
    tail = (ctx.work / "live-train.log").read_text(errors="replace").strip().splitlines()[-5:]
    ctx.results.check(name, "the second training run (--store-url) succeeded", code == 0, f"exit {code}: " + " | ".join(tail))
    finish(ctx, tab, name, "live.png")


# One entry per page or step, in the order they run; `--pages` picks by key.
PAGES: dict[str, Callable[[Context], None]] = {
    "/": page_rollouts,
    "/rollouts": page_rollout,
    "/runners": simple_page("/runners", "Runners", "runners.png"),
    "/training": simple_page("/training", "Training", "training.png", extra_training),
    "/resources": simple_page("/resources", "Resources", "resources.png", extra_resources),
    "/governance": simple_page("/governance", "Governance", "governance.png", extra_governance),
    "/governance/audit": page_audit,
    # Last: it writes a second training run into the store that the pages above read.
    "live": page_live,
}


def selected(pages: str | None) -> list[str]:
    if not pages:
        return list(PAGES)
    keys = [p.strip() for p in pages.split(",") if p.strip()]
    unknown = [k for k in keys if k not in PAGES]
    if unknown:
        raise ValueError(f"unknown page(s) {', '.join(unknown)}; known: {', '.join(PAGES)}")
    return [k for k in PAGES if k in keys]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="the store's base URL (http://127.0.0.1:PORT)")
    ap.add_argument("--agl", help="the agl binary (for the live check's second training run)")
    ap.add_argument("--work", type=Path, help="a scratch directory")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--screenshots", type=Path, help="where to save the screenshots")
    ap.add_argument("--pages", help=f"comma-separated entries to run (default all): {', '.join(PAGES)}")
    ap.add_argument("--audit", action="store_true", help="the store serves a flight recorder (--audit-db)")
    ap.add_argument("--list", action="store_true", help="only print the entries --pages selects")
    args = ap.parse_args()
    try:
        keys = selected(args.pages)
    except ValueError as e:
        print(f"dashboard_test.py: {e}", file=sys.stderr)
        return 2
    if args.list:
        print(" ".join(keys))
        return 0
    missing = [f"--{a}" for a in ("url", "agl", "work", "screenshots") if getattr(args, a) is None]
    if missing:
        print(f"dashboard_test.py: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    args.screenshots.mkdir(parents=True, exist_ok=True)

    results = Results()
    started = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        print(f"chromium {browser.version} (playwright), {args.url}", flush=True)
        ctx = Context(args.url.rstrip("/"), args.screenshots, args.agl, args.work, args.audit, browser, results)
        for key in keys:
            try:
                PAGES[key](ctx)
            except Exception as e:  # one broken page must not hide the others' results
                results.check(key, "runs to the end", False, f"{type(e).__name__}: {e}")
        browser.close()
    print(
        f"{results.passed} passed, {results.failed} failed, {results.skipped} skipped "
        f"({', '.join(keys)}; {time.monotonic() - started:.1f} s)",
        flush=True,
    )
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
