"""The topology page as a person sees it: rendered by headless Chromium, read from the screenshot.

Needs Debian's `chromium` (`apt-get install chromium`; .ci/run installs it where it can); skipped
with a message where it is absent.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter

import pytest

from tests.fixtures.builders import gpu_job, ten_thousand_nodes
from webhook.objects.feed import index_of
from webhook.settings.config import Config
from webhook.kube import demo
from webhook import admission
from webhook.admission.recent import RecentDecisions
from webhook.serving.page.snapshot import snapshot
from webhook.serving.page import heatmap
from webhook.serving.page.render import COLOURS, render

BROWSER = next((path for path in map(shutil.which, ("chromium", "chromium-browser")) if path), None)
WIDTH, HEIGHT = 1280, 1000
SCREEN = (1280, 800)  # where the overview must be whole, unscrolled
MAX_PAGE_BYTES = 2 * 1024 * 1024
SWATCH = 9 * 13 - 4  # a legend's colour sample, in pixels, less its four rounded corners
LEAF_BORDER = (0x63, 0x66, 0xF1)  # the frame of a leaf block (.d.lf)
EDGE_PIXELS = 40  # a leaf's top or bottom border is a horizontal run at least this long

pytestmark = pytest.mark.skipif(BROWSER is None, reason="chromium is not installed (Debian: apt-get install "
                                                       "chromium): the page is not rendered in a browser")


def pixels(png: bytes) -> list[list[tuple[int, int, int]]]:
    """Rows of RGB pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, data = 8, b""
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        chunk = png[position + 8:position + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and colour in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            data += chunk
        position += 12 + length
    step = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(data), width * step
    rows, previous = [], bytearray(stride)
    for y in range(height):
        filter_type, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - step] if x >= step else 0
            up, corner = previous[x], previous[x - step] if x >= step else 0
            if filter_type == 1:
                line[x] = (line[x] + left) & 0xFF
            elif filter_type == 2:
                line[x] = (line[x] + up) & 0xFF
            elif filter_type == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif filter_type == 4:
                guess = left + up - corner
                nearest = min((abs(guess - left), 0, left), (abs(guess - up), 1, up), (abs(guess - corner), 2, corner))
                line[x] = (line[x] + nearest[2]) & 0xFF
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, step)])
        previous = line
    return rows


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def long_runs(rows: list[list[tuple[int, int, int]]], colour: tuple[int, int, int]) -> int:
    runs = 0
    for row in rows:
        length = 0
        for pixel in row + [None]:
            if pixel == colour:
                length += 1
                continue
            runs += length >= EDGE_PIXELS
            length = 0
    return runs


def screenshot(page_file, shot, size: tuple[int, int]) -> list[list[tuple[int, int, int]]]:
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", f"--window-size={size[0]},{size[1]}",
                    f"--screenshot={shot}", page_file.as_uri()], check=True, capture_output=True, timeout=120)
    return pixels(shot.read_bytes())


def test_ten_thousand_nodes_are_all_in_the_overview_at_1280x800_unscrolled(tmp_path):
    page = render(snapshot(index_of(Config(), *ten_thousand_nodes()), [], now=0.0), refresh_seconds=10)
    assert len(page.encode()) <= MAX_PAGE_BYTES
    page_file = tmp_path / "topology.html"
    page_file.write_text(page)
    rows = screenshot(page_file, tmp_path / "topology.png", SCREEN)
    assert (len(rows[0]), len(rows)) == SCREEN
    counts = Counter(pixel for row in rows for pixel in row)
    side = int(re.search(r"\{width:(\d+)px;height:\1px\}", page).group(1))  # a cell's, in pixels
    assert side >= 4  # big enough to point at
    # Each leaf's first node is half free, its last a quarter free: shades nothing else on the page
    # has but the legend's samples. All 313 of each on screen: every leaf's first and last row is.
    for shade in ("qp3", "qp2"):
        assert counts[hex_rgb(heatmap.COLOURS[shade])] == 313 * side * side + SWATCH, shade
    idle = 10_000 - 2 * 313
    assert counts[hex_rgb(heatmap.COLOURS["qf"])] >= idle * side * side


def test_the_demo_page_with_a_placed_job_shows_its_leaves_and_gpus_in_a_browser(tmp_path):
    index = index_of(Config(), *demo.demo_cluster())
    decisions = RecentDecisions()
    job = gpu_job("train", 4, 8, placement_strategy="consolidated")
    decisions.record(admission.review(admission.make_review(job), index, Config()), 0.0)
    page = tmp_path / "topology.html"
    page.write_text(render(snapshot(index, decisions.entries(), now=0.0), live=False))
    shot = tmp_path / "topology.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", f"--window-size={WIDTH},{HEIGHT}",
                    f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120)
    rows = pixels(shot.read_bytes())
    assert len(rows) == HEIGHT and len(rows[0]) == WIDTH
    counts: dict[tuple[int, int, int], int] = {}
    for row in rows:
        for pixel in row:
            counts[pixel] = counts.get(pixel, 0) + 1
    background = max(counts, key=counts.get)
    assert background == (255, 255, 255) and counts[background] < 0.9 * WIDTH * HEIGHT  # not blank
    cell = 9 * 13  # one GPU's cell, in pixels
    for part, gpus in (("used", 90), ("held", 32), ("free", 134)):  # the demo's, with the job held
        assert counts.get(hex_rgb(COLOURS[part]), 0) >= gpus * cell, part
    assert long_runs(rows, LEAF_BORDER) == 2 * 8  # eight leaves, each framed top and bottom
