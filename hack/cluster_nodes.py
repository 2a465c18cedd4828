"""The local cluster's GPU nodes: N nodes of 8 H100 in the demo's zone > spine > leaf > node shape
(its 32 are tests/fixtures/demo-nodes.yaml's), created through the API in parallel; under --dra,
with their DeviceClass and ResourceSlices instead of GPUs in allocatable."""
from __future__ import annotations

import http.client
import itertools
import json
import ssl
import string
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from webhook.kube.demo import gpu_device_class, make_node, make_resource_slice

from .processes import Failed

DEMO_NODES = 32
MAX_NODES = 10_000
DEMO_SHAPE = (2, 4, 4)  # spines per zone, leaves per spine, nodes per leaf: the demo's
LOADERS = 16  # requests in flight while creating: the apiserver takes them in parallel


def parse_shape(text: str) -> tuple[int, int, int]:
    """'2/4/4' -> (spines per zone, leaves per spine, nodes per leaf), each 1 to 1000."""
    try:
        shape = tuple(int(part) for part in text.split("/"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or not all(1 <= part <= 1000 for part in shape):
        raise ValueError(f"--shape {text!r}: expected SPINES/LEAVES/NODES (spines per zone, leaves per spine, "
                         "nodes per leaf), each 1 to 1000, e.g. 2/4/4")
    return shape[0], shape[1], shape[2]


def zone_name(index: int) -> str:
    """zone-a ... zone-z, zone-aa, ...: the demo's one zone is zone-a."""
    letters = ""
    index += 1
    while index:
        index, digit = divmod(index - 1, 26)
        letters = string.ascii_lowercase[digit] + letters
    return f"zone-{letters}"


def gpu_nodes(count: int = DEMO_NODES, shape: tuple[int, int, int] = DEMO_SHAPE, dra: bool = False,
              ready: bool = True) -> list[dict]:
    """`count` nodes `gpu-sS-lL-nN`, filled leaf by leaf, spine by spine, zone by zone (spines and
    leaves numbered across the cluster, nodes within their leaf), labelled as webhook/kube/demo.py
    labels the demo's; `ready`: with a Ready condition (else KWOK's node-initialize stage gives it)."""
    spines_per_zone, leaves_per_spine, per_leaf = shape
    return [make_node(f"gpu-s{spine}-l{leaf}-n{node}", {
        "topology.kubernetes.io/zone": zone_name((spine - 1) // spines_per_zone),
        "topology.scheduler/spine": f"spine-{spine}", "topology.scheduler/leaf": f"leaf-{leaf}",
        "topology.scheduler/network-bandwidth": "400Gb"}, dra=dra, ready=ready)
        for spine, leaf, node in itertools.islice(_places(leaves_per_spine, per_leaf), count)]


def _places(leaves_per_spine: int, per_leaf: int) -> Iterator[tuple[int, int, int]]:
    for leaf in itertools.count(1):
        for node in range(1, per_leaf + 1):
            yield (leaf - 1) // leaves_per_spine + 1, leaf, node


def dra_objects(nodes: list[dict]) -> list[dict]:
    """The DeviceClass of whole GPUs and one ResourceSlice per node, with the attributes NVIDIA's
    DRA driver publishes for an H100 (dra-driver-nvidia-gpu)."""
    out = [gpu_device_class()]
    for node in nodes:
        name = node["metadata"]["name"]
        piece = make_resource_slice(name)
        for index, device in enumerate(piece["spec"]["devices"]):
            device["attributes"].update({  # no index or minor: the minor is only in the device name
                "architecture": {"string": "Hopper"}, "brand": {"string": "Nvidia"},
                "cudaComputeCapability": {"version": "9.0.0"}, "cudaDriverVersion": {"version": "12.8.0"},
                "driverVersion": {"version": "570.124.6"},
                "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + 0x10 * index:02x}:00.0"},
                "resource.kubernetes.io/numaNode": {"int": index // 4}})
        out.append(piece)
    return out


def api_client(admin: str) -> k8s_client.ApiClient:
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=admin, client_configuration=configuration)
    return k8s_client.ApiClient(configuration)


def create_nodes(admin: str, nodes: list[dict]) -> None:
    """Nodes with their status (the apiserver keeps a Node's status on create: no kubelet writes it
    here, or KWOK writes it afterwards)."""
    connect, headers = admin_https(admin)
    post_all(connect, headers, "/api/v1/nodes", [json.dumps(node).encode() for node in nodes])


def admin_https(admin: str) -> tuple[Callable[[], http.client.HTTPSConnection], dict[str, str]]:
    """What plain HTTPS to the apiserver needs, read from the admin's kubeconfig: a maker of
    connections and the headers with the admin's token."""
    with open(admin, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    server = urllib.parse.urlsplit(cluster["server"])
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    headers = {"Authorization": f"Bearer {user['token']}", "Content-Type": "application/json"}
    return (lambda: http.client.HTTPSConnection(server.hostname or "", server.port, context=context)), headers


def post_all(connect: Callable[[], http.client.HTTPSConnection], headers: dict[str, str], path: str,
             bodies: list[bytes]) -> None:
    """Objects serialized once, POSTed to `path` over LOADERS connections at once (the API client's
    own serializing would take most of the time); anything but 201 fails."""
    def post(share: list[bytes]) -> None:
        connection = connect()
        try:
            for body in share:
                connection.request("POST", path, body, headers)
                answer = connection.getresponse()
                text = answer.read()
                if answer.status != 201:
                    raise Failed(f"POST {path}: HTTP {answer.status} {text[:200]!r}")
        finally:
            connection.close()
    with ThreadPoolExecutor(LOADERS) as pool:
        list(pool.map(post, [bodies[start::LOADERS] for start in range(LOADERS)]))


def wait_ready(admin: str, count: int, seconds: float) -> None:
    """Until `count` node Leases are in kube-node-lease (KWOK's heartbeats) and `count` nodes are
    Ready; listed every second per 2,000 nodes, as a list of them all costs the apiserver too."""
    api = k8s_client.CoreV1Api(api_client(admin))
    leases = k8s_client.CoordinationV1Api(api.api_client)
    deadline = time.monotonic() + seconds
    held = ready = 0
    while time.monotonic() < deadline:
        time.sleep(max(1.0, count / 2000))
        held = len(json.loads(leases.list_namespaced_lease("kube-node-lease", resource_version="0",
                                                           _preload_content=False).data)["items"])
        if held < count:
            continue
        listed = json.loads(api.list_node(resource_version="0", _preload_content=False).data)["items"]
        ready = sum(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
                    for n in listed)
        if ready == count:
            return
    raise Failed(f"kwok: {held} of {count} node Leases and {ready} nodes Ready within {seconds:.0f} s")
