"""The topology page: /topology (HTML) and /topology.json on the metrics port, and the same page
written to a file by `mutate --html`.

One self-contained document: inline CSS and SVG, no script, nothing loaded from elsewhere (the
Content-Security-Policy forbids it too), so it works air-gapped and through `kubectl
port-forward`. Filtering is a plain GET form and refreshing a meta refresh, both server-side.
Every name in it passes through html.escape: a pod named `<script>` shows as text.

Behind the metrics port's access checks (access.py) a reader may see less than everything: the
request's PageScope says which namespaces' workloads and holds the snapshot keeps (the others are
neither listed, counted nor outlined); the tree, the capacity, is everyone's.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Callable, Iterable, Iterator
from urllib.parse import parse_qs, urlencode

from ...admission import AdmissionOutcome
from ...state.index import ClusterIndex
from ...credentials.access import EVERYTHING, SCOPE_ENVIRON_KEY, PageScope, visible_namespaces
from ..paths import TOPOLOGY_JSON_PATH
from . import heatmap
from ...admission.recent import RecentDecisions
from .nodes import FREE, HELD, OUT, USED
from .snapshot import Selection, namespaces_present, snapshot
from .words import e as _e
from .words import fits, room

log = logging.getLogger(__name__)

DEFAULT_REFRESH_SECONDS = 10
MAX_REFRESH_SECONDS = 3600
MAX_QUERY_FIELDS = 8
# Nothing from anywhere: styles are inline, there is no script, the form submits to this page.
CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
                           "base-uri 'none'; frame-ancestors 'none'")
COLOURS = {"used": "#475569", "held": "#f59e0b", "free": "#22c55e", "out": "#f87171"}
_CLASSES = {"used": USED, "held": HELD, "free": FREE, "out": OUT}  # a GPU cell's CSS class is its letter
_OUTCOME_ORDER = (AdmissionOutcome.WAITING, AdmissionOutcome.WAITING_FOR_GROWTH, AdmissionOutcome.WAITING_FOR_NODES,
                  AdmissionOutcome.PLACED, AdmissionOutcome.REPAIRED, AdmissionOutcome.DENIED,
                  AdmissionOutcome.SUSPENDED, AdmissionOutcome.NOT_READY, AdmissionOutcome.FAILED_OPEN)

_STYLE = """
body{font:13px/1.35 system-ui,-apple-system,'Segoe UI',sans-serif;margin:12px;color:#1e293b;background:#fff}
h1{font-size:18px;margin:0 0 2px}h2{font-size:15px;margin:16px 0 4px}
.meta{color:#475569;font-size:12px;font-weight:normal;margin-left:8px}.note{color:#92400e}
.sum{display:flex;flex-wrap:wrap;align-items:center;gap:4px 12px;margin:2px 0 4px}
.legend i,.g i{display:inline-block;width:9px;height:13px;border-radius:1px;vertical-align:middle}
.legend span{margin-right:10px}
form{margin:0 0 0 8px}input{font:inherit;width:10em}
.c{display:flex;flex-wrap:wrap;align-items:flex-start}
.d{border:1px solid #94a3b8;border-radius:5px;padding:3px 4px;margin:3px;background:#f1f5f9}
.d .d{background:#fff}.d.lf{background:#eef2ff;border-color:#6366f1}
.h{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin-bottom:2px}.h small{color:#475569}
.ns{display:flex;flex-direction:column}
.n{display:flex;align-items:center;gap:5px;padding:1px 3px;border-radius:3px}
.n .nm{font:11px ui-monospace,monospace;min-width:9em}.n em{color:#b91c1c;font-size:11px}
.n.out{background:#fee2e2}.mark{outline:2px solid #2563eb}
.g{display:inline-flex;gap:1px;margin-right:3px}
table{border-collapse:collapse}td,th{border-bottom:1px solid #e2e8f0;padding:2px 6px;text-align:left;vertical-align:top}
td.r{text-align:right}.o-waiting,.o-waiting-for-growth,.o-waiting-for-nodes{color:#b45309}.o-placed{color:#15803d}.o-denied{color:#b91c1c}
ul{margin:0;padding-left:16px}
""" + "".join(f"i.{_CLASSES[part]},rect.{part}{{background:{colour};fill:{colour}}}" for part, colour in COLOURS.items())


def _bar(gpus: dict) -> str:
    """Used, held, out and free GPUs of a domain as one stacked bar."""
    total = gpus["total"]
    if not total:
        return ""
    rects, x = [], 0.0
    for part in ("used", "held", "out", "free"):
        width = 100 * gpus[part] / total
        if width:
            rects.append(f'<rect x="{x:.1f}" width="{width:.1f}" height="8" class="{part}"/>')
        x += width
    return f'<svg width="90" height="8" viewBox="0 0 100 8" preserveAspectRatio="none">{"".join(rects)}</svg>'


def _domain(block: dict, selection: dict, live: bool, leaf_level: str, above: str = "") -> str:
    """A domain's block: its header, then its children's blocks or its nodes, or what is not drawn.
    Blocks of the last configured level (leaves) have a frame of their own. Children of level
    `above` are left to the overview (they are its cells or its units), counted."""
    gpus = block["gpus"]
    summary = (f'{gpus["used"]} used, {gpus["held"]} held, {gpus["free"]} free'
               + (f', {gpus["out"]} out of service' if gpus["out"] else "")
               + f' of {gpus["total"]} GPUs; pods that fit now (count\u00d7GPUs): {fits(block)}')
    title = block["name"] if block["name"] == block["level"] else f'{block["level"]} {block["name"]}'
    head = [f'<b>{_e(title)}</b>', _bar(gpus),
            f'<small>{round(100 * block["utilization"])}% &middot; {gpus["free"]} free'
            + (f' &middot; {gpus["held"]} held' if gpus["held"] else "")
            + f' &middot; {_e(room(block))}'
            + (f' &middot; {block["partly_used_nodes"]} part-used' if block["partly_used_nodes"] else "")
            + "</small>"]
    inner = ""
    children = block.get("children", [])
    if children and children[0]["level"] == above:
        head.append(f'<small>{len(children)} {_e(above)} domains: in the overview'
                    + (", a click opens one" if live else "") + "</small>")
    elif children:
        inner = ('<div class="c">' + "".join(_domain(child, selection, live, leaf_level, above) for child in children)
                 + "</div>")
    elif "node_list" in block:
        inner = '<div class="ns">' + "".join(_node(node) for node in block["node_list"]) + "</div>"
    else:
        hidden = f'{block["hidden_domains"]} domains' if "hidden_domains" in block else f'{block["nodes"]} nodes'
        if live:  # the link opens this domain's nodes
            query = {**{k: v for k, v in selection.items() if v}, "focus": block["name"]}
            hidden = f'<a href="?{_e(urlencode(query))}#detail">{hidden}</a>'
        head.append(f"<small>{hidden}</small>")
    without = block.get("nodes_without_gpus") or block.get("domains_without_gpus")
    if without:
        what = ("node" if "node_list" in block else "domain") + ("s" if without > 1 else "")
        inner += f"<small>and {without} {what} without GPUs</small>"
    classes = "d" + (" lf" if block["level"] == leaf_level else "") + (" mark" if block["marked"] else "")
    return (f'<div class="{classes}" data-domain="{_e(block["name"])}" title="{_e(summary)}">'
            f'<div class="h">{"".join(head)}</div>{inner}</div>')


def _node(node: dict) -> str:
    gpus = node["gpus"]
    groups = "".join('<span class="g">' + "".join(f"<i class={letter}></i>" for letter in group) + "</span>"
                     for group in node["nvlink"])
    classes = "n" + (" out" if node["out"] else "") + (" mark" if node["marked"] else "")
    why = f'<em>{_e(node["out"])}</em>' if node["out"] else ""
    pods = f'<small>{node["pods"]} pod{"" if node["pods"] == 1 else "s"}' if node["pods"] else ""
    if node["workloads"]:
        pods += ": " + ", ".join(map(_e, node["workloads"]))
    return (f'<div class="{classes}" data-node="{_e(node["name"])}" '
            f'data-free="{gpus["free"]}" title="{_e(heatmap.node_title(node))}">'
            f'<span class="nm">{_e(node["name"])}</span>{groups}{why}{pods + "</small>" if pods else ""}</div>')


def find(block: dict, name: str, path: tuple[dict, ...] = ()) -> tuple[dict, ...]:
    """The blocks from the cluster down to the one named `name` (first found), or ()."""
    path = path + (block,)
    if block["name"] == name:
        return path
    for child in block.get("children", ()):
        found = find(child, name, path)
        if found:
            return found
    return ()


def _detail(data: dict, live: bool) -> Iterator[str]:
    """The detail below the overview: the selected domain (`focus`), else the whole tree, every
    node drawn when they are few enough, else down to the domains the overview draws."""
    tree, selection = data["tree"], data["selection"]
    leaf_level = data["levels"][-1] if data["levels"] else ""
    path = find(tree, selection["focus"]) if selection["focus"] else ()
    if path:
        trail = " &gt; ".join(_e(block["name"]) for block in path)
        yield f'<h2 id="detail">Detail: {trail}</h2>'
        block, above = path[-1], ""
    else:
        yield f'<h2 id="detail">Detail: {"every node" if data["nodes_drawn"] else "the domains"}</h2>'
        if selection["focus"]:
            yield f'<div class="note">no domain is named {_e(selection["focus"])}</div>'
        block, above = tree, "" if data["nodes_drawn"] else data["overview"]["level"]
        if not data["nodes_drawn"]:
            yield (f'<div class="note">{data["gpu_node_count"]} GPU nodes: more than {data["node_detail_limit"]}, '
                   "so nodes are drawn only for one domain at a time"
                   + (": click it in the overview" if live else "") + "</div>")
    legend = "".join(f"<span><i class={_CLASSES[part]}></i> {part}</span>" for part in COLOURS)
    yield (f'<div class="legend">{legend}<span>a cell per GPU, grouped by NVLink domain; hover a block for the pods '
           "that fit in it now</span></div>")
    yield f'<div class="c">{_domain(block, selection, live, leaf_level, above)}</div>'


def _rows(rows: Iterable[list[str]]) -> str:
    return "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)


def _workloads(entries: list[dict]) -> str:
    if not entries:
        return "<p>No admissions recorded yet.</p>"
    rank = {outcome: i for i, outcome in enumerate(_OUTCOME_ORDER)}
    ordered = sorted(entries, key=lambda e: (rank.get(e["outcome"], len(rank)), e["age_s"]))
    replicas = any(e.get("replica") for e in entries)  # offline (mutate --html) there is only this run
    body = _rows([
        f'<td>{_e(e["kind"])} {_e(e["namespace"])}/{_e(e["name"])}</td>',
        f'<td class="o-{_e(e["outcome"])}">{_e(e["outcome"])}{" (" + _e(e["code"]) + ")" if e["code"] else ""}</td>',
        f'<td class="r">{e["gpus"] or ""}</td>', f'<td>{_e(e["domain"] or "")}</td>',
        "<td><ul>" + "".join(f"<li>{_e(reason)}</li>" for reason in e["reasons"]) + "</ul></td>",
        f'<td class="r">{_age(e["age_s"])}</td>'] + ([f'<td>{_e(e["replica"])}</td>'] if replicas else [])
        for e in ordered)
    return ("<table><tr><th>Workload</th><th>Outcome</th><th>GPUs</th><th>Domain</th><th>Why</th><th>Ago</th>"
            + ("<th>Replica</th>" if replicas else "") + f"</tr>{body}</table>")


def _holds(rows: list[dict], total: int) -> str:
    if not rows:
        return "<p>No GPUs are held.</p>"
    body = _rows([
        f'<td>{_e(r["kind"])} {_e(r["namespace"])}/{_e(r["name"])}</td>', f'<td class="r">{r["gpus"]}</td>',
        f'<td>{_e(", ".join(r["nodes"]))}{" &hellip;" if r["node_count"] > len(r["nodes"]) else ""}</td>',
        f'<td>{_expiry(r["expires_in_s"])}</td>',
        f'<td>{_e(r["source"])}</td>'] for r in rows)
    more = f"<p>{total - len(rows)} more not listed.</p>" if total > len(rows) else ""
    return ("<table><tr><th>Held for</th><th>GPUs</th><th>Nodes</th><th>Expires</th><th>From</th></tr>"
            f"{body}</table>{more}")


def _out_of_service(rows: list[dict], total: int) -> str:
    if not rows:
        return "<p>Every GPU node is in service.</p>"
    body = _rows([f'<td>{_e(r["node"])}</td>', f'<td>{_e(r["domain"])}</td>', f'<td>{_e(r["reason"])}</td>',
                  f'<td class="r">{r["gpus"]}</td>'] for r in rows)
    more = f"<p>{total - len(rows)} more not listed.</p>" if total > len(rows) else ""
    return f"<table><tr><th>Node</th><th>Domain</th><th>Why</th><th>GPUs</th></tr>{body}</table>{more}"


def _expiry(seconds: float | None) -> str:
    if seconds is None:
        return "when its pods bind"
    # Holds expire before the next decision is made: until then an overdue one still counts.
    return "in " + _age(seconds) if seconds > 0 else "due (at the next admission)"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"


def _form(selection: dict) -> str:
    focus = f'<input type="hidden" name="focus" value="{_e(selection["focus"])}">' if selection["focus"] else ""
    return ('<form method="get">Namespace <input name="namespace" value="' + _e(selection["namespace"])
            + '"> Workload <input name="workload" value="' + _e(selection["workload"]) + '">' + focus
            + ' <button>Filter</button> <a href="?">clear</a></form>')


def render(data: dict, refresh_seconds: int = 0, live: bool = True) -> str:
    """The page for a snapshot: the overview, then the detail of the selected domain, then the
    workloads, holds and nodes out of service. `live`: served (a filter form, links that open a
    domain); otherwise a file (offline `mutate --html`)."""
    tree, selection = data["tree"], data["selection"]
    gpus = tree["gpus"]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["generated_at"]))
    refresh = f'<meta http-equiv="refresh" content="{refresh_seconds}">' if refresh_seconds else ""
    notes = []
    if selection["namespace"] or selection["workload"]:
        notes.append("outlined: where the selected workloads are placed or held")
    if data.get("namespaces_shown") is not None:
        shown = ", ".join(data["namespaces_shown"]) or "none"
        notes.append(f"workloads and holds of the namespaces where you may list pods only ({_e(shown)}); "
                     "the GPU counts are the whole cluster's"
                     + (f'; {data["namespaces_unchecked"]} more namespaces not checked: filter by namespace'
                        if data.get("namespaces_unchecked") else ""))
    filtered = f' for {_e(selection["namespace"] or "every namespace")}' + (
        f' / {_e(selection["workload"])}' if selection["workload"] else "")
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">', refresh,
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>GPU topology &middot; {gpus['free']} of {gpus['total']} free</title>"
        f"<style>{_STYLE}{heatmap.STYLE}</style></head><body>",
        f'<h1>GPU topology <small class="meta">{when} &middot; {data["gpu_node_count"]} GPU nodes'
        + (f' of {data["node_count"]}' if data["node_count"] != data["gpu_node_count"] else "") + ' &middot; levels '
        f'{_e(" > ".join(data["levels"] + ["node"]))}'
        + (f" &middot; refreshes every {refresh_seconds} s" if refresh_seconds else "") + "</small></h1>",
        f'<div class="sum"><b>{gpus["total"]} GPUs</b><b>{gpus["used"]} used</b><b>{gpus["held"]} held</b>'
        f'<b>{gpus["free"]} free</b><b>{gpus["out"]} out of service</b>'
        f'<b>{_e(room(tree))} now</b>{_form(selection) if live else ""}</div>',
        "".join(f'<div class="note">{note}</div>' for note in notes),
        heatmap.overview(data, live),
        *_detail(data, live),
        f"<h2>Workloads{filtered}</h2>", _workloads(data["workloads"]),
        f"<h2>Holds{filtered}</h2>", _holds(data["holds"], data["holds_total"]),
        "<h2>Out of service</h2>", _out_of_service(data["out_of_service"], data["out_of_service_total"]),
        "</body></html>\n"])


class BadQuery(ValueError):
    """A query the page cannot take; answered 400 with the message."""


def _query(environ: dict) -> tuple[Selection, int]:
    try:
        query = parse_qs(environ.get("QUERY_STRING") or "", max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        raise BadQuery(f"at most {MAX_QUERY_FIELDS} query parameters") from None

    def arg(name: str) -> str:
        return (query.get(name) or [""])[0]

    refresh_text = arg("refresh") or str(DEFAULT_REFRESH_SECONDS)
    if not (refresh_text.isascii() and refresh_text.isdigit()) or int(refresh_text) > MAX_REFRESH_SECONDS:
        raise BadQuery(f"refresh={refresh_text[:20]!r}: allowed: whole seconds from 0 (never) to {MAX_REFRESH_SECONDS}")
    return Selection.of(arg("namespace"), arg("workload"), arg("focus")), int(refresh_text)


def page_app(index: ClusterIndex, decisions: RecentDecisions, clock: Callable[[], float] = time.time) -> Callable:
    """The WSGI app of /topology and /topology.json: read-only, GET and HEAD only."""

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        method = environ.get("REQUEST_METHOD") or "GET"
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
            return [b"the topology page is read-only: GET or HEAD\n"]
        try:
            selection, refresh = _query(environ)
        except BadQuery as err:
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{err}\n".encode()]
        try:
            entries = decisions.entries()
            scope: PageScope = environ.get(SCOPE_ENVIRON_KEY, EVERYTHING)
            unchecked = 0
            if scope.may_list is not None:  # asked outside the index lock: the answers may take API calls
                present = namespaces_present(index, entries)
                if selection.namespace:
                    present &= {selection.namespace}
                shown, unchecked = visible_namespaces(present, scope.may_list)
                selection = replace(selection, namespaces=shown)
            data = snapshot(index, entries, clock(), selection)
            if unchecked:
                data["namespaces_unchecked"] = unchecked
            if environ.get("PATH_INFO") == TOPOLOGY_JSON_PATH:
                body, kind = json.dumps(data, separators=(",", ":")).encode(), "application/json"
            else:
                body, kind = render(data, refresh).encode(), "text/html; charset=utf-8"
        except Exception:  # a bug of ours: one failed page, never the metrics thread
            log.exception("topology page failed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [b"the topology page failed; see the webhook's log\n"]
        start_response("200 OK", [
            ("Content-Type", kind), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
            ("Content-Security-Policy", CONTENT_SECURITY_POLICY), ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer")])
        return [b"" if method == "HEAD" else body]

    return app


def write_page(path: str, index: ClusterIndex, decisions: RecentDecisions, now: float) -> None:
    """The page, as a file: no refresh, no form (offline `mutate --html`)."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(render(snapshot(index, decisions.entries(), now), live=False))

