"""Topology page cost: time to snapshot and render, page size, how long the index lock is held, and
how long a browser takes to draw the page.

    python bench/page_bench.py [--sizes 1000 10000 100000] [--repeat 5] [--browser chromium]
                               [--screenshot FILE]

Clusters are placement_bench's (zones > spines > leaves of 32 nodes x 8 H100, part-occupied with a
fixed seed), with one hold per 50 nodes (a 1 x 8-GPU workload each) and 500 recorded decisions.
Per size: the median over `--repeat` runs of the snapshot (of which the part under the index lock,
in all and its longest hold: what an admission may wait for), the HTML render, the JSON encoding,
and the sizes of both; at sizes above the node detail limit, also the page with one leaf opened
(`?focus=`). With `--browser`, headless Chromium loads each page (without its refresh) `--repeat`
times at 1280x800 through the DevTools protocol: the median milliseconds from navigation start to
the first contentful paint, and to the first frame after the load event, when the whole page is
laid out and painted. `--screenshot FILE`: a PNG of the page at the largest size, as a person sees
it at 1280x800 (docs/topology-page.md shows one).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.placement_bench import cluster  # noqa: E402
from webhook.objects.feed import index_of  # noqa: E402
from webhook.state.index import ClusterIndex  # noqa: E402
from webhook.settings.config import Config  # noqa: E402
from webhook.admission.recent import RecordedDecision  # noqa: E402
from webhook.serving.page.snapshot import NODE_DETAIL_LIMIT, Selection, snapshot  # noqa: E402
from webhook.serving.page.render import render  # noqa: E402

DECISIONS = 500
NODES_PER_HOLD = 50
SCREEN = (1280, 800)
# Resolves two frames after the load event: the page is laid out and painted by then.
PAINTED = ("new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done({"
           "frame: performance.now(), fcp: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime"
           "}))))")


class TimedLock:
    """The index's lock, recording how long each outermost hold lasts."""

    def __init__(self, lock) -> None:
        self.lock, self.depth, self.held = lock, 0, []

    def __enter__(self):
        self.lock.acquire()
        self.depth += 1
        if self.depth == 1:
            self.started = time.perf_counter()
        return self

    def __exit__(self, *_exc):
        self.depth -= 1
        if self.depth == 0:
            self.held.append(time.perf_counter() - self.started)
        self.lock.release()


def build(size: int) -> tuple[ClusterIndex, list[RecordedDecision]]:
    nodes, pods = cluster(size)
    index = index_of(Config(), nodes, pods)
    idle = [name for name, node in index.nodes.items() if node.free == node.gpus]
    decisions = []
    for i, name in enumerate(idle[::NODES_PER_HOLD]):
        index.reserve(f"ml/Job/job-{i}", {name: [tuple(range(8))]})
    for i in range(DECISIONS):
        decisions.append(RecordedDecision(at=float(i), namespace="ml", kind="Job", name=f"job-{i}",
                                          outcome="placed" if i % 3 else "waiting", gpus=8, domain="leaf l1",
                                          code=None if i % 3 else "NoRoomNow",
                                          reasons=("4 pod(s) x 8 GPU(s) in leaf l1: the tightest leaf",),
                                          nodes=("n00001",)))
    return index, decisions


def measure(index: ClusterIndex, decisions: list[RecordedDecision], repeat: int, selection: Selection) -> dict:
    timed = TimedLock(index.lock)
    index.lock = timed
    snap, html, encode, longest, locked = [], [], [], [], []
    for _ in range(repeat):
        timed.held = []
        started = time.perf_counter()
        data = snapshot(index, decisions, now=1e9, selection=selection)
        snap.append(time.perf_counter() - started)
        longest.append(max(timed.held))
        locked.append(sum(timed.held))
        started = time.perf_counter()
        page = render(data, refresh_seconds=10)
        html.append(time.perf_counter() - started)
        started = time.perf_counter()
        body = json.dumps(data, separators=(",", ":"))
        encode.append(time.perf_counter() - started)
    index.lock = timed.lock
    return {"snapshot_ms": statistics.median(snap) * 1000, "locked_ms": statistics.median(locked) * 1000,
            "longest_ms": statistics.median(longest) * 1000,
            "render_ms": statistics.median(html) * 1000, "json_ms": statistics.median(encode) * 1000,
            "html_kb": len(page.encode()) / 1024, "json_kb": len(body) / 1024, "drawn": data["nodes_drawn"],
            "still_page": render(data, refresh_seconds=0)}


class DevTools:
    """Chromium's DevTools protocol over its websocket: calls, and the events that came meanwhile."""

    def __init__(self, url: str) -> None:
        self.socket = websocket.create_connection(url, timeout=120)
        self.sent = 0
        self.events: list[str] = []

    def call(self, method: str, **params) -> dict:
        self.sent += 1
        self.socket.send(json.dumps({"id": self.sent, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result") or {}
            self.events.append(message.get("method", ""))

    def wait(self, event: str) -> None:
        while event not in self.events:
            self.events.append(json.loads(self.socket.recv()).get("method", ""))
        self.events.clear()


def browser_times(page: str, browser: str, repeat: int, screenshot: str | None = None) -> dict:
    """Median ms from navigation start to the first contentful paint and to the painted page."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp, "topology.html")
        path.write_text(page)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        process = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                    "--force-device-scale-factor=1", f"--window-size={SCREEN[0]},{SCREEN[1]}",
                                    f"--remote-debugging-port={port}", f"--user-data-dir={tmp}/profile",
                                    "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                        target = next(t for t in json.load(answer) if t["type"] == "page")
                    break
                except (OSError, StopIteration):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            tools = DevTools(target["webSocketDebuggerUrl"])
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=SCREEN[0], height=SCREEN[1], deviceScaleFactor=1,
                       mobile=False)  # the window's size less its frame would be smaller
            painted, contentful = [], []
            for run in range(repeat):
                tools.call("Page.navigate", url=f"{path.as_uri()}?run={run}")
                tools.wait("Page.loadEventFired")
                times = tools.call("Runtime.evaluate", expression=PAINTED, awaitPromise=True,
                                   returnByValue=True)["result"]["value"]
                painted.append(times["frame"])
                contentful.append(times.get("fcp") or times["frame"])
            if screenshot:
                shot = tools.call("Page.captureScreenshot", format="png")["data"]
                pathlib.Path(screenshot).write_bytes(base64.b64decode(shot))
        finally:
            process.terminate()
            process.wait(30)
    return {"fcp_ms": statistics.median(contentful), "painted_ms": statistics.median(painted)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--browser", metavar="PATH", help="also time the page in this Chromium (headless)")
    parser.add_argument("--screenshot", metavar="FILE", help="with --browser: a PNG of the largest size's page")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}; node detail limit {NODE_DETAIL_LIMIT}")
    print(f"{'nodes':>7} {'view':>11} {'snapshot':>9} {'locked':>8} {'longest':>8} {'render':>8} {'json':>8} "
          f"{'html':>9} {'json':>9}" + (f" {'fcp':>8} {'painted':>8}" if args.browser else ""))
    for size in args.sizes:
        started = time.perf_counter()
        index, decisions = build(size)
        built = time.perf_counter() - started
        views = [("all", Selection())]
        if size > NODE_DETAIL_LIMIT:
            views.append(("focus leaf", Selection.of(focus="l1")))
        for view, selection in views:
            row = measure(index, decisions, args.repeat, selection)
            shot = args.screenshot if args.browser and size == max(args.sizes) and view == "all" else None
            browser = browser_times(row["still_page"], args.browser, args.repeat, shot) if args.browser else {}
            print(f"{size:>7} {view:>11} {row['snapshot_ms']:>7.1f}ms {row['locked_ms']:>6.1f}ms "
                  f"{row['longest_ms']:>6.1f}ms {row['render_ms']:>6.1f}ms {row['json_ms']:>6.1f}ms "
                  f"{row['html_kb']:>7.0f}KB {row['json_kb']:>7.0f}KB"
                  + (f" {browser['fcp_ms']:>6.0f}ms {browser['painted_ms']:>6.0f}ms" if browser else "")
                  + ("" if view != "all" else f"   (index built in {built:.1f} s)"))


if __name__ == "__main__":
    main()
