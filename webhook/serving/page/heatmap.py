"""The overview at the top of the topology page: one SVG heatmap of the whole cluster, a cell per
node (or, above snapshot.HEATMAP_NODE_LIMIT GPU nodes, per domain of the overview's level, leaves
usually), grouped in frames by the configured levels (zone > spine > leaf).

A cell's colour is its `state` (nodes.state_of): free, some free (four shades by the share of its
in-service GPUs free), none free but held, none free, out of service. Hovering a cell shows its
title: a node's GPU counts, its NVLink domains (a letter per GPU) and its pods' workloads; served
live, clicking a leaf (or a domain cell) opens its detail below (`?focus=`).

The layout is computed here, in pixels, so that it fits where it is read: every frame packs its
children in rows (shelves), and of a few cell sizes and frame shapes the largest cells whose
layout fits 1280x800 under the page's head are taken (the smallest when none fits: then it
scrolls). No script: titles and links are all a browser needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlencode

from .words import e, gpu_sums, room

WIDTH = 1250  # px the overview may take: 1280 less the page's margins
HEIGHT = 660  # px left for it at 1280x800 under the page's head, legend, form and two lines of notes
PITCHES = (24, 18, 14, 11, 9, 7, 6, 5, 4)  # a cell and the 1 px gap after it, largest first
ASPECTS = (0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0, 5.6, 8.0)  # width : height a frame packs its children to, tried in turn
LABEL = 12  # px of a frame's label line
PAD = 2  # px inside a frame, around its children
SHARES = (0.25, 0.5, 0.75)  # where the four shades of "some free" change
# A cell's class, by state: every class begins with "q", so that no rule of the page's detail applies.
COLOURS = {"qf": "#22c55e", "qp4": "#4fb070", "qp3": "#6b9a7a", "qp2": "#84a08f", "qp1": "#9aa5a6",
           "qh": "#f59e0b", "qu": "#475569", "qx": "#f87171"}
CLASSES = {"free": "qf", "held": "qh", "used": "qu", "out": "qx"}
LEGEND = (("qf", "free"), ("qp4", "some free: \u00be+"), ("qp3", "\u00bd+"), ("qp2", "\u00bc+"), ("qp1", "less"),
          ("qh", "none free, held"), ("qu", "none free"), ("qx", "out of service"))
FRAME_COLOUR = "#94a3b8"
UNIT_COLOUR = "#818cf8"  # the frame of one unit (a leaf of node cells)
STYLE = ("svg.ov{display:block;font:10px system-ui,sans-serif}.ov text{fill:#334155}"
         f".ov .fr{{fill:none;stroke:{FRAME_COLOUR}}}.ov .lf{{fill:#fff;stroke:{UNIT_COLOUR}}}"
         ".ov .sel{stroke:#2563eb;stroke-width:3}.ov .m{stroke:#2563eb;stroke-width:2}"
         ".ov a:hover .lf{fill:#e0e7ff}"
         + "".join(f".ov .{cls},i.{cls}{{fill:{colour};background:{colour}}}" for cls, colour in COLOURS.items()))


def shade(state: str, gpus: dict) -> str:
    """The CSS class of a cell in `state` with these GPU counts."""
    if state != "part":
        return CLASSES[state]
    share = gpus["free"] / max(1, gpus["total"] - gpus["out"])
    return f"qp{1 + sum(share >= bound for bound in SHARES)}"


def letters_counts(nvlink: list[str]) -> dict[str, int]:
    """A node's GPU counts from its letters (nodes.gpu_states: one letter per GPU)."""
    text = "".join(nvlink)
    return {"total": len(text), "used": text.count("u"), "held": text.count("h"), "free": text.count("f"),
            "out": text.count("x")}


def node_title(node: dict) -> str:
    gpus = letters_counts(node["nvlink"])
    pods = node.get("pods", 0)
    workloads = node.get("workloads") or []
    said = f'{pods} pod{"" if pods == 1 else "s"}' if pods else "no GPU pods"
    if workloads:
        said += ": " + ", ".join(workloads)
    return (f'{node["name"]}: {gpu_sums(gpus)}' + (f' ({node["out"]})' if node.get("out") else "")
            + f' \u00b7 NVLink {" ".join("[" + group + "]" for group in node["nvlink"])} \u00b7 {said}')


def block_title(block: dict) -> str:
    return f'{block["level"]} {block["name"]}: {gpu_sums(block["gpus"])}; {room(block)}'


@dataclass
class Box:
    """One frame or cell of the layout: its block, its node cells (a unit of node cells) or its
    children (a frame), and where it lands."""

    block: dict
    nodes: list[dict] = field(default_factory=list)
    children: list["Box"] = field(default_factory=list)
    cell: bool = False  # a domain drawn as one cell
    width: int = 0
    height: int = 0
    x: int = 0
    y: int = 0
    columns: int = 0  # node cells per row (a unit)


def unit_nodes(block: dict) -> list[dict]:
    """The nodes of a unit block, however far it was drawn."""
    if "node_list" in block or "cells" in block:
        return block.get("node_list") or block.get("cells") or []
    return [node for child in block.get("children", ()) for node in unit_nodes(child)]


def boxes(block: dict, level: str, node_cells: bool) -> Box:
    """The layout's tree for `block`: frames down to the overview's level, then units."""
    if block["level"] == level or not block.get("children"):
        return Box(block, nodes=unit_nodes(block)) if node_cells else Box(block, cell=True)
    return Box(block, children=[boxes(child, level, node_cells) for child in block["children"]])


def measure(box: Box, pitch: int, aspect: float, width: int, fill: bool = False) -> None:
    """Sizes every box for cells of `pitch` and frames packed to `aspect`, in at most `width` px
    (`fill`: `box` takes that width, its children still packed to `aspect`)."""
    if box.cell:
        box.width = box.height = pitch
        return
    if not box.children:
        count = max(1, len(box.nodes))
        box.columns = max(1, min(count, math.ceil(math.sqrt(count * aspect)), (width - 2) // pitch))
        box.width = box.columns * pitch + 3
        box.height = math.ceil(count / box.columns) * pitch + 3
        return
    for child in box.children:
        measure(child, pitch, aspect, width - 2 * PAD)
    area = sum(child.width * child.height for child in box.children)
    inner = min(width - 2 * PAD, max(max(child.width for child in box.children), int(math.sqrt(area * aspect))))
    if fill:
        inner = max(inner, width - 2 * PAD)
    used, height = shelves(box.children, inner)
    box.width, box.height = used + 2 * PAD, height + LABEL + 2 * PAD


def shelves(children: list[Box], width: int, gap: int = 2) -> tuple[int, int]:
    """Place `children` left to right in rows of at most `width` px; (width used, height)."""
    x = y = row = used = 0
    for child in children:
        if x and x + child.width > width:
            x, y, row = 0, y + row + gap, 0
        child.x, child.y = x, y
        x += child.width + gap
        row = max(row, child.height)
        used = max(used, x - gap)
    return used, y + row


def layout(root: Box) -> tuple[int, int]:
    """Measure the overview with the largest cells that fit WIDTH x HEIGHT (the smallest when none
    does); (pitch, height). Of each cell size, the lowest of two layouts for each aspect: the top
    frames packed in rows as they come, or all in one row, each as wide as its share of the cells."""
    tops = root.children
    cells = sum(max(1, len(box.nodes)) for box in walk(root) if not box.children)
    gaps = 4 * (len(tops) - 1)

    def height_at(pitch: int, aspect: float, one_row: bool) -> int:
        for top in tops:
            measure(top, pitch, aspect, WIDTH)
        if one_row and len(tops) > 1:
            shares = [top.width * top.height for top in tops]
            for top, share in zip(tops, shares):
                measure(top, pitch, aspect, max(top.width // 4, (WIDTH - gaps) * share // sum(shares)), fill=True)
        return shelves(tops, WIDTH, gap=4)[1]

    sizes = [pitch for pitch in PITCHES if cells * pitch * pitch <= WIDTH * HEIGHT] or [PITCHES[-1]]
    for pitch in sizes:
        height, aspect, one_row = min((height_at(pitch, aspect, one_row), aspect, one_row)
                                      for aspect in ASPECTS for one_row in (False, True))
        if height <= HEIGHT:
            break
    return pitch, height_at(pitch, aspect, one_row)


def walk(box: Box) -> Iterator[Box]:
    yield box
    for child in box.children:
        yield from walk(child)


def draw(box: Box, x: int, y: int, pitch: int, link: dict | None, focus: str) -> Iterator[str]:
    """SVG of `box` placed at its offset from (x, y)."""
    x, y = x + box.x, y + box.y
    block = box.block
    href = f' href="?{e(urlencode({**link, "focus": block["name"]}))}#detail"' if link is not None else ""
    if box.cell:
        cls = (shade(block["state"], block["gpus"]) + (" m" if block["marked"] else "")
               + (" sel" if block["name"] == focus else ""))
        rect = f'<rect x="{x}" y="{y}" class="{cls}"><title>{e(block_title(block))}</title></rect>'
        yield f"<a{href}>{rect}</a>" if href else rect
        return
    if not box.children:
        selected = " sel" if block["name"] == focus else ""
        yield (f'<a{href}>' if href else "") + f'<g transform="translate({x},{y})" data-unit="{e(block["name"])}">'
        yield (f'<rect class="lf{selected}" x="0.5" y="0.5" width="{box.width - 1}" height="{box.height - 1}">'
               f'<title>{e(block_title(block))}</title></rect>')
        for i, node in enumerate(box.nodes):
            row, column = divmod(i, box.columns)
            gpus = letters_counts(node["nvlink"])
            cls = shade(node["state"], gpus) + (" m" if node.get("marked") else "")
            yield (f'<rect x="{2 + column * pitch}" y="{2 + row * pitch}" class="{cls}">'
                   f"<title>{e(node_title(node))}</title></rect>")
        yield "</g>" + ("</a>" if href else "")
        return
    yield (f'<rect class="fr" x="{x + 0.5}" y="{y + 0.5}" width="{box.width - 1}" height="{box.height - 1}">'
           f'<title>{e(block_title(block))}</title></rect>'
           f'<text x="{x + PAD + 1}" y="{y + LABEL - 1}">{e(block["name"])}</text>')
    for child in box.children:
        yield from draw(child, x + PAD, y + PAD + LABEL, pitch, link, focus)


def overview(data: dict, live: bool) -> str:
    """The heatmap of `data` (a snapshot), with its legend."""
    node_cells = data["overview"]["cells"] == "nodes"
    root = boxes(data["tree"], data["overview"]["level"], node_cells)
    if root.cell or not root.children:  # one domain only: its cells are the whole overview
        root = Box(data["tree"], children=[root])
    pitch, height = layout(root)
    selection = data["selection"]
    link = {k: v for k, v in selection.items() if v and k != "focus"} if live else None
    tops = root.children
    parts = [f'<svg class="ov" width="{WIDTH}" height="{height + 1}" shape-rendering="crispEdges">',
             "<style>" + ",".join(f".ov .{cls}" for cls in COLOURS)
             + f"{{width:{pitch - 1}px;height:{pitch - 1}px}}</style>"]
    for top in tops:
        parts.extend(draw(top, 0, 0, pitch, link, selection["focus"]))
    parts.append("</svg>")
    unit = "node" if node_cells else f'{data["overview"]["level"]}'
    legend = "".join(f"<span><i class={cls}></i> {e(word)}</span>" for cls, word in LEGEND)
    hint = f"one cell per {unit}; hover a cell for its GPUs" + (
        ", NVLink domains and pods" if node_cells else "") + ("; click to open it below" if live else "")
    return f'<div class="legend">{legend}<span>{hint}</span></div>' + "".join(parts)
