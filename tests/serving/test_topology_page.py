"""The topology page: its snapshot, the HTML and JSON made from it, the metrics port and `mutate --html`."""
from __future__ import annotations

import json
import re
import socket
from html.parser import HTMLParser
from typing import Iterator
from unittest import mock

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import review_of
from tests.fixtures.builders import gpu_job, gpu_pod, ten_thousand_nodes
from webhook.core.gpus import nvlink_groups
from webhook.objects.feed import index_of
from webhook.objects import feed
from webhook import cli
from webhook.state.index import ClusterIndex
from webhook.settings.config import Config
from webhook.settings.loading import levels_from
from webhook.kube import demo
from webhook import admission
from webhook.serving.page import snapshot as overview
from webhook.admission.recent import RecentDecisions
from webhook.serving.page.snapshot import Selection, snapshot
from webhook.serving.page import render as topology_page
from webhook.serving.metrics_port import start_metrics_server
from webhook.serving.page.render import page_app, render

LEVELS = ("topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf")
DEMO_LEAVES = [f"leaf-{i}" for i in range(1, 9)]
MAX_PAGE_BYTES = 2 * 1024 * 1024
SCRIPT_NAME = "<script>alert(1)</script>"


def admit(index: ClusterIndex, obj: dict, decisions: RecentDecisions, at: float = 0.0) -> admission.AdmissionResult:
    result = admission.review(admission.make_review(obj), index, Config())
    decisions.record(result, at)
    return result


@pytest.fixture
def demo_index(clock) -> ClusterIndex:
    return index_of(Config(), *demo.demo_cluster(), clock=clock)


@pytest.fixture
def placed(demo_index) -> RecentDecisions:
    """The demo cluster after one placed 4 x 8-GPU Job."""
    decisions = RecentDecisions()
    assert admit(demo_index, gpu_job("train", 4, 8, placement_strategy="consolidated"), decisions).outcome == "placed"
    return decisions


class PageReader(HTMLParser):
    """What the page draws: in the detail, nodes with their free GPUs and domains; in the overview,
    its units (leaves of node cells) and its cells ([class, title]), with the links around them;
    and every text run."""

    def __init__(self) -> None:
        super().__init__()
        self.free: dict[str, int] = {}
        self.domains: list[str] = []
        self.units: list[str] = []
        self.cells: list[list[str]] = []
        self.links: list[str] = []
        self.text: list[str] = []
        self.tags: set[str] = set()
        self.in_cell = False

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attributes = dict(attrs)
        if "data-node" in attributes:
            self.free[attributes["data-node"]] = int(attributes["data-free"])
        if "data-domain" in attributes:
            self.domains.append(attributes["data-domain"])
        if "data-unit" in attributes:
            self.units.append(attributes["data-unit"])
        if tag == "a" and "href" in attributes:
            self.links.append(attributes["href"])
        if tag == "rect" and (attributes.get("class") or "").startswith("q"):
            self.cells.append([attributes["class"].split()[0], ""])
            self.in_cell = True

    def handle_endtag(self, tag):
        if tag == "rect":
            self.in_cell = False

    def handle_data(self, data):
        self.text.append(data)
        if self.in_cell:
            self.cells[-1][1] += data

    def cell_titles(self) -> dict[str, str]:
        """Each node cell's title, by the node it names."""
        return {title.partition(":")[0]: title for _, title in self.cells}


def read_page(page: str) -> PageReader:
    reader = PageReader()
    reader.feed(page)
    return reader


def json_nodes(block: dict) -> dict[str, dict]:
    nodes = {node["name"]: node for node in block.get("node_list", ())}
    for child in block.get("children", ()):
        nodes.update(json_nodes(child))
    return nodes


def external_references(page: str) -> list[str]:
    """Anything that would make a browser load something: a URL, a script, a stylesheet link, an import."""
    return re.findall(r"(?i)https?:|//[a-z0-9]|<script|<link|<iframe|<img|@import|url\(|src=", page)


# ----- the snapshot --------------------------------------------------------------------------------

def test_the_snapshot_draws_every_leaf_and_node_with_the_held_gpus_of_a_placed_job(demo_index, placed):
    data = snapshot(demo_index, placed.entries(), now=10.0)
    zone = data["tree"]["children"][0]
    leaves = {leaf["name"]: leaf for spine in zone["children"] for leaf in spine["children"]}
    assert list(leaves) == DEMO_LEAVES  # in natural order
    placed_entry = data["workloads"][0]
    assert (placed_entry["kind"], placed_entry["name"], placed_entry["outcome"]) == ("Job", "train", "placed")
    assert placed_entry["reasons"] and placed_entry["age_s"] == 10.0
    scope = placed_entry["domain"].split()[-1]
    assert leaves[scope]["gpus"]["held"] == 32
    assert [node["nvlink"] for node in leaves[scope]["node_list"]] == [["hhhhhhhh"]] * 4
    assert data["holds"][0]["gpus"] == 32 and data["holds"][0]["expires_in_s"] == Config().reservation_ttl_seconds
    for name, node in json_nodes(data["tree"]).items():
        assert node["gpus"]["free"] == demo_index.nodes[name].free


def test_holds_count_down_by_the_index_clock_and_an_overdue_one_says_so(demo_index, placed, clock):
    ttl = Config().reservation_ttl_seconds
    clock.now += 100
    [hold] = snapshot(demo_index, placed.entries(), now=0.0)["holds"]
    assert hold["expires_in_s"] == ttl - 100
    clock.now += ttl  # no admission since: the hold is not released yet, and still counts
    data = snapshot(demo_index, placed.entries(), now=0.0)
    assert data["holds"][0]["expires_in_s"] == -100 and data["tree"]["gpus"]["held"] == 32
    assert "due (at the next admission)" in render(data)


def test_a_pending_pod_that_carries_our_placement_is_listed_as_held_until_it_binds(demo_index):
    decisions = RecentDecisions()
    result = admit(demo_index, gpu_pod("solo", 2, placement_strategy="consolidated"), decisions)
    demo_index.release("ml/Pod/solo")  # the admission's own hold gone: the pod's own stands in
    feed.upsert(demo_index, {**result.admitted, "metadata": {**result.admitted["metadata"], "uid": "u-solo"}}, "Pod")
    [hold] = snapshot(demo_index, decisions.entries(), now=0.0)["holds"]
    assert (hold["name"], hold["gpus"], hold["expires_in_s"], hold["source"]) == ("solo", 2, None, "pending pods")


def test_out_of_service_nodes_say_why_and_count_their_idle_gpus_as_out():
    nodes, pods = demo.demo_cluster()
    nodes[0]["spec"]["unschedulable"] = True  # gpu-s1-l1-n1, 8 GPUs in use
    nodes[2]["status"]["conditions"][0]["status"] = "False"  # gpu-s1-l1-n3, idle
    index = index_of(Config(), nodes, pods)
    data = snapshot(index, [], now=0.0)
    drawn = json_nodes(data["tree"])
    assert drawn["gpu-s1-l1-n1"]["out"] == "cordoned"
    assert drawn["gpu-s1-l1-n1"]["gpus"] == {"total": 8, "used": 8, "held": 0, "free": 0, "out": 0}
    assert drawn["gpu-s1-l1-n3"]["gpus"] == {"total": 8, "used": 0, "held": 0, "free": 0, "out": 8}
    assert drawn["gpu-s1-l1-n3"]["nvlink"] == ["xxxxxxxx"]
    assert [(row["node"], row["reason"]) for row in data["out_of_service"]] == [
        ("gpu-s1-l1-n1", "cordoned"), ("gpu-s1-l1-n3", "NotReady")]
    assert data["tree"]["gpus"]["out"] == 8


def test_a_pod_bound_onto_held_gpus_shows_the_counts_placement_uses(demo_index, placed):
    data = snapshot(demo_index, placed.entries(), now=0.0)
    node_name = data["holds"][0]["nodes"][0]
    intruder = demo.make_pod("intruder", node_name, 2, annotations={"topology.scheduler/gpu-ids": "0,1"})
    feed.upsert(demo_index, intruder, "Pod")  # the scheduler knows nothing of our holds
    node = json_nodes(snapshot(demo_index, placed.entries(), now=0.0)["tree"])[node_name]
    assert node["gpus"] == {"total": 8, "used": 2, "held": 6, "free": 0, "out": 0}
    assert sorted("".join(node["nvlink"])) == sorted("uuhhhhhh")


def test_a_namespace_or_workload_filter_keeps_its_workloads_and_outlines_where_they_are(demo_index, placed):
    admit(demo_index, gpu_pod("other", 1, namespace="team-b", placement_strategy="consolidated"), placed)
    data = snapshot(demo_index, placed.entries(), now=0.0, selection=Selection.of(workload="TRAIN"))
    assert [entry["name"] for entry in data["workloads"]] == ["train"]
    assert [hold["name"] for hold in data["holds"]] == ["train"]
    marked = {name for name, node in json_nodes(data["tree"]).items() if node["marked"]}
    assert marked == set(data["holds"][0]["nodes"])
    only_b = snapshot(demo_index, placed.entries(), now=0.0, selection=Selection.of(namespace="team-b"))
    assert [entry["name"] for entry in only_b["workloads"]] == ["other"]
    assert not any(node["marked"] for node in json_nodes(snapshot(demo_index, placed.entries(), 0.0)["tree"]).values())


def test_only_each_workloads_latest_decision_is_listed_and_ignored_objects_are_not(demo_index):
    decisions = RecentDecisions(size=3)
    admit(demo_index, gpu_pod("a", 1, placement_strategy="consolidated"), decisions, at=1.0)
    admit(demo_index, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}},
          decisions, at=2.0)
    admit(demo_index, gpu_pod("a", 1, preferred_domain="leaf-99"), decisions, at=3.0)  # denied now
    [entry] = snapshot(demo_index, decisions.entries(), now=5.0)["workloads"]
    assert (entry["name"], entry["outcome"], entry["age_s"]) == ("a", "denied", 2.0)
    assert "leaf-99" in entry["reasons"][0]


def test_a_large_cluster_is_drawn_down_to_leaves_and_a_focused_leaf_opens(monkeypatch, clock):
    monkeypatch.setattr(overview, "NODE_DETAIL_LIMIT", 10)
    index = index_of(Config(), *demo.demo_cluster(), clock=clock)
    data = snapshot(index, [], now=0.0)
    assert not data["nodes_drawn"] and json_nodes(data["tree"]) == {}
    leaves = [leaf for spine in data["tree"]["children"][0]["children"] for leaf in spine["children"]]
    assert [leaf["name"] for leaf in leaves] == DEMO_LEAVES and all("node_list" not in leaf for leaf in leaves)
    focused = snapshot(index, [], now=0.0, selection=Selection.of(focus="leaf-3"))
    assert sorted(json_nodes(focused["tree"])) == [f"gpu-s1-l3-n{i}" for i in range(1, 5)]
    monkeypatch.setattr(overview, "BLOCK_LIMIT", 4)  # 8 leaves are too many blocks: spines are the smallest
    spines = snapshot(index, [], now=0.0)["tree"]["children"][0]["children"]
    assert [spine["hidden_domains"] for spine in spines] == [4, 4]


def test_nodes_and_domains_without_gpus_are_counted_not_drawn_nor_counted_against_the_node_limit(monkeypatch):
    monkeypatch.setattr(overview, "NODE_DETAIL_LIMIT", 32)
    nodes, pods = demo.demo_cluster()
    cpu = [demo.make_node(f"cpu-{i}", {LEVELS[0]: "zone-a", LEVELS[1]: "spine-1", LEVELS[2]: "leaf-1"}, gpus=0)
           for i in range(3)]
    cpu += [demo.make_node(f"cpu-pool-{i}", {LEVELS[0]: "zone-cpu", LEVELS[1]: "cpu", LEVELS[2]: "cpu"}, gpus=0)
            for i in range(3)]
    data = snapshot(index_of(Config(), nodes + cpu, pods), [], now=0.0)
    assert data["nodes_drawn"] and (data["node_count"], data["gpu_node_count"]) == (38, 32)
    assert [zone["name"] for zone in data["tree"]["children"]] == ["zone-a"]
    assert data["tree"]["domains_without_gpus"] == 1
    leaf_1 = data["tree"]["children"][0]["children"][0]["children"][0]
    assert leaf_1["nodes_without_gpus"] == 3 and len(leaf_1["node_list"]) == 4
    page = render(data)
    assert "and 1 domain without GPUs" in page and "and 3 nodes without GPUs" in page and "cpu-0" not in page


@st.composite
def clusters(draw):
    """A configuration of one to three of the zone/spine/leaf levels, and nodes of a random tree
    (some missing labels, some out of service, some without GPUs, with NVLink domains of 8 or of
    2), with pods, and holds on random GPUs (overlapping pods' GPUs at times)."""
    levels = draw(st.sampled_from([LEVELS, LEVELS[1:], LEVELS[2:], LEVELS[:1]]))
    config = Config(levels=levels_from(list(levels)))
    nodes, pods, holds = [], [], {}
    for i in range(draw(st.integers(1, 14))):
        gpus = draw(st.sampled_from([0, 4, 8]))
        labels = dict(zip(LEVELS, draw(st.sampled_from([("z0", "s0", "l0"), ("z0", "s0", "l1"), ("z0", "s1", "l2"),
                                                        ("z1", "s2", "l3"), ("z0", "s1"), ()]))))
        state = draw(st.sampled_from(["ok", "ok", "cordoned", "down"]))
        product = draw(st.sampled_from(["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"]))
        nodes.append(demo.make_node(f"n{i}", labels, gpus, product, unschedulable=state == "cordoned",
                                    ready=state != "down"))
        used = draw(st.integers(0, gpus))
        if used:
            pods.append(demo.make_pod(f"p{i}", f"n{i}", used))
        if gpus and draw(st.booleans()):
            held = draw(st.lists(st.integers(0, gpus - 1), unique=True, min_size=1, max_size=gpus))
            holds.setdefault(f"ml/Job/j{draw(st.integers(0, 2))}", {})[f"n{i}"] = [tuple(sorted(held))]
    return config, nodes, pods, holds


def check_sums(block: dict) -> dict:
    """Every block's GPUs are its nodes' sums; returns the block's."""
    parts = [check_sums(child) for child in block.get("children", ())]
    parts += [node["gpus"] for node in block.get("node_list", ())]
    assert "children" in block or "node_list" in block, block["name"]  # drawn down to nodes
    summed = {key: sum(part[key] for part in parts) for key in ("total", "used", "held", "free", "out")}
    assert block["gpus"] == summed, block["name"]
    return block["gpus"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_every_domain_sums_its_nodes_and_every_node_its_gpus(cluster):
    config, nodes, pods, holds = cluster
    index = index_of(config, nodes, pods)
    for key, sets in holds.items():
        index.reserve(key, sets)
    data = snapshot(index, [], now=0.0)
    check_sums(data["tree"])
    drawn = json_nodes(data["tree"])
    assert set(drawn) == {name for name, node in index.nodes.items() if node.gpus > 0}
    for name, node in drawn.items():
        state = index.nodes[name]
        gpus = node["gpus"]
        assert gpus["free"] == state.free and gpus["total"] == state.gpus
        assert gpus["used"] + gpus["held"] + gpus["free"] + gpus["out"] == gpus["total"]
        assert [len(group) for group in node["nvlink"]] == [len(group) for group in nvlink_groups(state.nvlink_domains, state.gpus)]
        letters = "".join(node["nvlink"])
        assert [letters.count(c) for c in "uhfx"] == [gpus["used"], gpus["held"], gpus["free"], gpus["out"]]
    free_on_page = read_page(render(data)).free
    assert free_on_page == {name: node["gpus"]["free"] for name, node in drawn.items()}
    with mock.patch.object(overview, "NODE_DETAIL_LIMIT", 0):  # nodes not drawn: the overview's cells list them
        cells = [cell for block in blocks(snapshot(index, [], now=0.0)["tree"]) for cell in block.get("cells", ())]
    assert [(cell["name"], cell["nvlink"], cell["state"]) for cell in cells] == [
        (name, node["nvlink"], node["state"]) for name, node in drawn.items()]


def blocks(block: dict) -> Iterator[dict]:
    yield block
    for child in block.get("children", ()):
        yield from blocks(child)


# ----- the HTML ------------------------------------------------------------------------------------

def test_a_workload_and_a_node_named_with_html_show_as_text(clock):
    nodes, pods = demo.demo_cluster()
    nodes[0]["metadata"]["name"] = "<b>n</b>"
    index = index_of(Config(), nodes, [], clock=clock)
    decisions = RecentDecisions()
    admit(index, gpu_pod(SCRIPT_NAME, 1, namespace='x" onmouseover="1', placement_strategy="consolidated"), decisions)
    page = render(snapshot(index, decisions.entries(), now=0.0, selection=Selection.of(workload="<script>")))
    assert "<script" not in page and "<b>n</b>" not in page and 'x" onmouseover' not in page
    reader = read_page(page)
    assert SCRIPT_NAME in "".join(reader.text) and "<b>n</b>" in reader.free
    assert reader.tags.isdisjoint({"script", "link", "img", "iframe"})


def test_the_page_names_every_leaf_and_loads_nothing_from_elsewhere(demo_index, placed):
    page = render(snapshot(demo_index, placed.entries(), now=0.0), refresh_seconds=10)
    reader = read_page(page)
    assert set(DEMO_LEAVES) <= set(reader.domains)
    assert "Job ml/train" in " ".join("".join(reader.text).split())
    assert external_references(page) == []
    assert '<meta http-equiv="refresh" content="10">' in page


def test_the_page_of_ten_thousand_nodes_has_a_cell_per_node_and_stays_under_two_megabytes():
    data = snapshot(index_of(Config(), *ten_thousand_nodes()), [], now=0.0)
    assert data["overview"] == {"cells": "nodes", "node_limit": 10_000, "level": "leaf"}
    page = render(data)
    assert len(page.encode()) < MAX_PAGE_BYTES
    reader = read_page(page)
    assert len(reader.units) == 313 and len(reader.cells) == 10_000
    titles = reader.cell_titles()
    assert titles["n00000"] == "n00000: 4 used, 4 free of 8 GPUs \u00b7 NVLink [uuuuffff] \u00b7 1 pod"
    assert [cls for cls, _ in reader.cells[:3]] == ["qp3", "qf", "qf"] and reader.cells[31][0] == "qp2"
    assert reader.domains == ["cluster", "z0", *(f"s{i}" for i in range(8)), "z1", *(f"s{i}" for i in range(8, 16)),
                              "z2", *(f"s{i}" for i in range(16, 20))]  # the detail stops above the overview's leaves
    assert sum(href.endswith("#detail") and "focus=l" in href for href in reader.links) == 313


def test_a_leaf_opened_from_the_overview_is_the_detail_with_its_nodes_and_their_pods(clock):
    index = index_of(Config(), *ten_thousand_nodes())
    page = render(snapshot(index, [], now=0.0, selection=Selection.of(focus="l3")))
    reader = read_page(page)
    assert reader.domains == ["l3"] and sorted(reader.free) == [f"n{i:05d}" for i in range(96, 128)]
    assert "Detail: cluster > z0 > s0 > l3" in " ".join("".join(reader.text).split())
    assert len(reader.cells) == 10_000  # the overview stays whole, the leaf outlined in it
    assert '<rect class="lf sel"' in page and page.count(" sel") == 1


def test_every_node_appears_in_the_overview_once_with_its_state_and_a_large_cluster_by_leaf(monkeypatch, demo_index,
                                                                                           placed):
    cordoned = next(node for node in demo.demo_cluster()[0] if node["metadata"]["name"] == "gpu-s2-l7-n1")
    cordoned["spec"]["unschedulable"] = True
    feed.upsert(demo_index, cordoned, "Node")
    data = snapshot(demo_index, placed.entries(), now=0.0)
    states = {node["name"]: node["state"] for node in json_nodes(data["tree"]).values()}
    assert len(states) == 32 and states["gpu-s2-l7-n1"] == "out"
    assert {states[name] for name in data["holds"][0]["nodes"]} == {"held"}
    by_count = {"free": 8, "used": 0}
    for name, node in json_nodes(data["tree"]).items():
        if name != "gpu-s2-l7-n1" and not node["gpus"]["held"]:
            free = node["gpus"]["free"]
            assert node["state"] == next((state for state, count in by_count.items() if free == count), "part")
    classes = {title.partition(":")[0]: cls for cls, title in read_page(render(data)).cells}
    assert classes["gpu-s2-l7-n1"] == "qx" and classes[data["holds"][0]["nodes"][0]] == "qh"
    monkeypatch.setattr(overview, "HEATMAP_NODE_LIMIT", 31)  # above it: a cell per leaf
    data = snapshot(demo_index, placed.entries(), now=0.0)
    assert data["overview"]["cells"] == "domains"
    leaves = [leaf for spine in data["tree"]["children"][0]["children"] for leaf in spine["children"]]
    assert all("cells" not in leaf for leaf in leaves)
    cells = read_page(render(data)).cells
    assert [title.partition(":")[0] for _, title in cells] == [f"leaf {leaf}" for leaf in DEMO_LEAVES]
    held_leaf = placed.entries()[0].domain.split()[-1]
    assert cells[DEMO_LEAVES.index(held_leaf)][0] == "qh"  # its four nodes held: none free, held


def test_a_node_names_the_workloads_of_its_pods_only_to_readers_who_may_see_them(demo_index, placed):
    hold = snapshot(demo_index, placed.entries(), now=0.0)["holds"][0]
    for i, node in enumerate(hold["nodes"]):  # the Job's pods bound where it was placed
        pod = demo.make_pod(f"train-{i}", node, 8, namespace="ml")
        pod["metadata"]["annotations"] = {"topology.scheduler/reservation": "ml/Job/train"}
        feed.upsert(demo_index, pod, "Pod")
    node = hold["nodes"][0]
    data = snapshot(demo_index, placed.entries(), now=0.0)
    assert json_nodes(data["tree"])[node]["workloads"] == ["ml/Job/train"]
    assert read_page(render(data)).cell_titles()[node].endswith("1 pod: ml/Job/train")
    tenant = snapshot(demo_index, placed.entries(), now=0.0, selection=Selection.of(namespaces=frozenset({"team-b"})))
    assert json_nodes(tenant["tree"])[node]["workloads"] == [] and json_nodes(tenant["tree"])[node]["pods"] == 1
    assert "ml/Job/train" not in render(tenant)


# ----- the WSGI app --------------------------------------------------------------------------------

def call(app, path: str, query: str = "", method: str = "GET") -> tuple[str, dict, bytes]:
    answer = {}

    def start_response(status, headers):
        answer["status"], answer["headers"] = status, dict(headers)

    body = b"".join(app({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query}, start_response))
    return answer["status"], answer["headers"], body


def test_the_page_and_its_json_agree_and_forbid_every_load_from_elsewhere(demo_index, placed):
    app = page_app(demo_index, placed, clock=lambda: 0.0)
    status, headers, page = call(app, "/topology", "namespace=ml&refresh=0")
    assert status == "200 OK" and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"] and headers["Cache-Control"] == "no-store"
    assert b"http-equiv" not in page  # refresh=0: never
    status, headers, body = call(app, "/topology.json", "namespace=ml")
    assert status == "200 OK" and headers["Content-Type"] == "application/json"
    data = json.loads(body)
    assert data["selection"]["namespace"] == "ml"
    assert read_page(page.decode()).free == {name: node["gpus"]["free"] for name, node in json_nodes(data["tree"]).items()}


@pytest.mark.parametrize("method, query, status, said", [
    ("POST", "", "405 Method Not Allowed", b"read-only"),
    ("GET", "refresh=-1", "400 Bad Request", b"refresh='-1': allowed: whole seconds from 0 (never) to 3600"),
    ("GET", "refresh=99999", "400 Bad Request", b"allowed: whole seconds"),
    ("GET", "refresh=%C2%B2", "400 Bad Request", b"allowed: whole seconds"),  # a superscript 2: int() refuses it
    ("GET", "&".join(f"a{i}=1" for i in range(20)), "400 Bad Request", b"at most 8 query parameters"),
])
def test_a_request_the_page_cannot_take_gets_a_one_line_answer(demo_index, method, query, status, said):
    answer_status, _, body = call(page_app(demo_index, RecentDecisions()), "/topology", query, method)
    assert answer_status == status and said in body and body.count(b"\n") == 1


def test_head_answers_the_headers_without_the_page(demo_index):
    status, headers, body = call(page_app(demo_index, RecentDecisions()), "/topology", method="HEAD")
    assert status == "200 OK" and body == b"" and int(headers["Content-Length"]) > 1000


def test_a_failure_inside_the_page_is_a_500_and_a_log_line_not_a_dead_thread(demo_index, monkeypatch, caplog):
    def broken(*_args, **_kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(topology_page, "snapshot", broken)
    status, _, body = call(page_app(demo_index, RecentDecisions()), "/topology")
    assert status.startswith("500") and b"failed" in body and "topology page failed" in caplog.text


# ----- the real server and the command line --------------------------------------------------------

def test_after_a_placed_admission_the_metrics_port_serves_the_page_with_it(tls_server, apiserver):
    name = "page-check"
    apiserver.admit(review_of(gpu_pod(name, 1, namespace="page", placement_strategy="consolidated")))
    base = f"http://127.0.0.1:{tls_server.metrics_port}"
    response = requests.get(f"{base}/topology", timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/html")
    assert len(response.content) < MAX_PAGE_BYTES and external_references(response.text) == []
    reader = read_page(response.text)
    assert set(DEMO_LEAVES) <= set(reader.domains)
    assert f"Pod page/{name}" in " ".join("".join(reader.text).split())
    data = requests.get(f"{base}/topology.json", params={"namespace": "page"}, timeout=10).json()
    assert [(entry["name"], entry["outcome"]) for entry in data["workloads"]] == [(name, "placed")]
    assert reader.free == {node: entry["gpus"]["free"] for node, entry in json_nodes(data["tree"]).items()}


@pytest.mark.parametrize("served", [True, False])
def test_the_metrics_port_serves_the_page_unless_it_is_turned_off(demo_index, app, metrics, served):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    start_metrics_server(listener, metrics.registry, app, page_app(demo_index, RecentDecisions()) if served else None)
    response = requests.get(f"http://127.0.0.1:{port}/topology.json", timeout=5)  # bound before the call returned
    if served:
        assert response.status_code == 200 and "leaf-8" in response.text
    else:
        assert response.status_code == 404 and response.text == "not found: this port serves /metrics, /healthz, /readyz\n"
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


def test_mutate_writes_the_page_with_the_workloads_it_placed(tmp_path, capsys):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(json.dumps(gpu_job("train", 4, 8, placement_strategy="consolidated")))
    page_file = tmp_path / "page.html"
    assert cli.main(["mutate", "-f", str(manifest), "--nodes", "tests/fixtures/demo-nodes.yaml",
                     "--pods", "tests/fixtures/demo-pods.yaml", "--html", str(page_file)]) == 0
    page = page_file.read_text()
    reader = read_page(page)
    assert set(DEMO_LEAVES) <= set(reader.domains) and "Job ml/train" in " ".join("".join(reader.text).split())
    assert "<form" not in page and "http-equiv" not in page and external_references(page) == []


def test_mutate_says_when_it_cannot_write_the_page(tmp_path, capsys):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(json.dumps(gpu_job("train", 1, 8, placement_strategy="consolidated")))
    assert cli.main(["mutate", "-f", str(manifest), "--nodes", "tests/fixtures/demo-nodes.yaml",
                     "--html", str(tmp_path / "missing" / "page.html")]) == 2
    assert "--html" in capsys.readouterr().err


def test_a_hold_not_seen_stored_yet_is_listed_as_provisional_until_the_watch_shows_it(demo_index, clock):
    demo_index.ledger.provisional_seconds = 10.0  # as under a view fed from the API
    decisions = RecentDecisions()
    result = admit(demo_index, gpu_pod("solo", 2, placement_strategy="consolidated"), decisions)
    [hold] = snapshot(demo_index, decisions.entries(), now=0.0)["holds"]
    assert (hold["source"], hold["expires_in_s"]) == ("provisional admission", 10.0)
    feed.upsert(demo_index, {**result.admitted, "metadata": {**result.admitted["metadata"], "uid": "u-solo"}}, "Pod")
    [hold] = snapshot(demo_index, decisions.entries(), now=0.0)["holds"]
    assert (hold["source"], hold["expires_in_s"]) == ("admission", Config().reservation_ttl_seconds)
