"""Node topology discovery, run on fake NVML machines (tests/nvml_fakes.py) and a local API server."""
from __future__ import annotations

import argparse
import ctypes
import inspect
import json
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nvml_fakes as fakes
import pynvml
import pytest
import yaml

from webhook.core.gpus import NVLINK_DOMAINS_ANNOTATION, parse_nvlink_domains
from webhook.core.injection import GPU_IDS as GPU_IDS_ANNOTATION
from webhook.core.model import EXCEEDS_CLUSTER, Interconnect, Outcome, PlacementRequest
from webhook.discover import command, derive, facts
from webhook.discover import nvml as nvml_reading
from webhook.discover.derive import (CLIQUE_LABEL, DOMAIN_SIZE_LABEL, LINK_LABEL, MATRIX_ANNOTATION, NUMA_ANNOTATION,
                                     UNREADABLE_ANNOTATION)
from webhook.kube.demo import make_node, make_pod
from webhook.objects.feed import index_of
from webhook.placement.placer import place
from webhook.settings.config import Config


def matrix(*rows: str) -> str:
    """The matrix annotation from rows written with spaces, as `nvidia-smi topo -m` prints them."""
    return ";".join(",".join(row.split()) for row in rows)


def uniform(size: int, code: str) -> str:
    return matrix(*(" ".join("X" if i == j else code for j in range(size)) for i in range(size)))


def discover(machine: fakes.FakeMachine, **options) -> derive.Publication:
    return derive.publication(nvml_reading.read_node(fakes.fake_nvml(machine, **options)))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="topology-webhook")
    command.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["discover", *argv])


# ---------------------------------------------------------------------------------------------
# The fakes answer like nvidia-ml-py 13.615.71


def test_fake_functions_have_the_real_names_and_signatures():
    module = fakes.fake_nvml(fakes.dgx_h100())
    for name in fakes.FUNCTIONS:
        assert inspect.signature(getattr(module, name)) == inspect.signature(getattr(pynvml, name)), name


def test_fake_constants_and_errors_are_the_real_ones_including_the_read_caps_tuple():
    module = fakes.fake_nvml(fakes.dgx_h100())
    assert module.NVML_NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS  # 18 in 12.x bindings, 36 from 13.6xx
    assert module.NVML_P2P_CAPS_INDEX_READ == (0,)
    assert module.NVMLError_LibraryNotFound is pynvml.NVMLError_LibraryNotFound
    assert issubclass(module.NVMLError_NotSupported, module.NVMLError)


def test_fake_refuses_what_the_real_bindings_refuse():
    module = fakes.fake_nvml(fakes.dgx_h100())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()
    module.nvmlInit()
    first, second = module.nvmlDeviceGetHandleByIndex(0), module.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(ctypes.ArgumentError):
        module.nvmlDeviceGetP2PStatus(first, second, module.NVML_P2P_CAPS_INDEX_READ)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        module.nvmlDeviceGetNvLinkState(first, 18)  # H100 has 18 links
    with pytest.raises(TypeError):
        module.nvmlDeviceGetGpuFabricInfoV(first, module.c_nvmlGpuFabricInfoV_t())  # not byref
    assert module.nvmlDeviceGetNvLinkRemoteDeviceType(first, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert module.nvmlDeviceGetPciInfo(first).busId == "00000000:18:00.0"  # str in 13.x


def test_no_library_through_the_real_bindings():
    """The seam's default is the real pynvml: on this GPU-less machine it cannot find libnvidia-ml."""
    assert nvml_reading.load_nvml() is pynvml
    assert command.run(parse(["--dry-run"])) == facts.EXIT_NO_LIBRARY


# ---------------------------------------------------------------------------------------------
# What each machine publishes

MACHINES = [
    pytest.param(fakes.dgx_h100(), "0-7", uniform(8, "NV18"), "0-3,4-7", "nvswitch", "8", id="DGX H100"),
    pytest.param(fakes.hgx_a100(), "0-7", uniform(8, "NV12"), "0-1,2-3,4-5,6-7", "nvswitch", "8", id="HGX A100"),
    pytest.param(fakes.pcie_bridged_pairs(), "0-1,2-3",
                 matrix("X    NV12 SYS  SYS",
                        "NV12 X    SYS  SYS",
                        "SYS  SYS  X    NV12",
                        "SYS  SYS  NV12 X"), "0-1,2-3", "nvlink", "2", id="PCIe server, two bridged pairs"),
    pytest.param(fakes.pcie_bridged_pairs(((0, 2), (1, 3))), "0+2,1+3",
                 matrix("X    NODE NV12 SYS",
                        "NODE X    SYS  NV12",
                        "NV12 SYS  X    NODE",
                        "SYS  NV12 NODE X"), "0-1,2-3", "nvlink", "2", id="PCIe server, interleaved bridges"),
    pytest.param(fakes.two_nvlink_islands(), "0-3,4-7",
                 matrix("X   NV4 NV4 NV4 SYS SYS SYS SYS",
                        "NV4 X   NV4 NV4 SYS SYS SYS SYS",
                        "NV4 NV4 X   NV4 SYS SYS SYS SYS",
                        "NV4 NV4 NV4 X   SYS SYS SYS SYS",
                        "SYS SYS SYS SYS X   NV4 NV4 NV4",
                        "SYS SYS SYS SYS NV4 X   NV4 NV4",
                        "SYS SYS SYS SYS NV4 NV4 X   NV4",
                        "SYS SYS SYS SYS NV4 NV4 NV4 X"), "0-3,4-7", "nvlink", "4", id="two 4-GPU islands over PCIe"),
    pytest.param(fakes.gb200_nvl72_tray(), "0-3", uniform(4, "NV18"), "0-1,2-3", "nvswitch", "4",
                 id="GB200 NVL72 tray"),
    pytest.param(fakes.dgx_h100(fabric_manager=False), "", uniform(8, "NV18"), "0-3,4-7", "pcie", "0",
                 id="DGX H100 without fabric manager"),
    pytest.param(fakes.h100_alone_in_a_vm(), "", "X", "0", "none", "0", id="one H100 in a VM"),
]


@pytest.mark.parametrize("machine, domains, links, numa, link_class, domain_size", MACHINES)
def test_machine_publishes_domains_matrix_and_labels(machine, domains, links, numa, link_class, domain_size):
    published = discover(machine)
    assert published.annotations == {NVLINK_DOMAINS_ANNOTATION: domains, MATRIX_ANNOTATION: links,
                                     NUMA_ANNOTATION: numa}
    assert {k: v for k, v in published.labels.items() if k != CLIQUE_LABEL} == {
        LINK_LABEL: link_class, DOMAIN_SIZE_LABEL: domain_size}


def test_only_a_completed_multi_node_fabric_gives_a_clique_label():
    assert discover(fakes.gb200_nvl72_tray()).labels[CLIQUE_LABEL] == \
        f"{fakes.GB200_CLUSTER_UUID}.{fakes.GB200_CLIQUE}"
    assert CLIQUE_LABEL not in discover(fakes.dgx_h100()).labels  # completed, but a zero cluster UUID
    tray = fakes.gb200_nvl72_tray()
    tray.gpus[3].fabric = (fakes.real.NVML_GPU_FABRIC_STATE_IN_PROGRESS, bytes(16), 0)
    assert CLIQUE_LABEL not in discover(tray).labels


@pytest.mark.parametrize("machine", [fakes.dgx_h100(), fakes.pcie_bridged_pairs(), fakes.gb200_nvl72_tray()],
                         ids=lambda m: m.name)
def test_label_values_are_valid(machine):
    for value in discover(machine).labels.values():
        assert len(value) <= 63 and value.replace("-", "").replace(".", "").replace("_", "").isalnum()


def test_older_bindings_bytes_bus_ids_with_short_domain_give_the_same_result():
    for machine in (fakes.pcie_bridged_pairs, fakes.dgx_h100):
        assert discover(machine(), bytes_bus_ids=True) == discover(machine())


def test_gpu_lost_mid_read_is_reported_and_skipped():
    machine = fakes.dgx_h100()
    machine.lose = {3: "nvmlDeviceGetNvLinkState"}
    topology = nvml_reading.read_node(fakes.fake_nvml(machine))
    published = derive.publication(topology)
    assert published.annotations[NVLINK_DOMAINS_ANNOTATION] == "0-2+4-7"
    assert published.annotations[UNREADABLE_ANNOTATION] == "3"
    assert published.annotations[MATRIX_ANNOTATION].split(";")[3] == "-,-,-,X,-,-,-,-"
    assert published.labels[DOMAIN_SIZE_LABEL] == "7"
    assert topology.warnings == ("GPU 3 skipped: NVML error while reading it: GPU is lost",)


def test_failed_pair_call_leaves_that_cell_unknown():
    machine = fakes.pcie_bridged_pairs()
    ancestor = machine.ancestor

    def flaky(a, b):
        if {a, b} == {1, 2}:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return ancestor(a, b)

    machine.ancestor = flaky
    topology = nvml_reading.read_node(fakes.fake_nvml(machine))
    assert derive.link_matrix(topology)[1] == ("NV12", "X", "-", "SYS")
    assert topology.warnings == ("GPU 1 and GPU 2: topology: Unknown Error",)


def test_nvml_is_shut_down_after_every_read():
    module = fakes.fake_nvml(fakes.hgx_a100())
    nvml_reading.read_node(module)
    assert module.fake.initialised == 0 and module.fake.calls[-1] == "nvmlShutdown"


# ---------------------------------------------------------------------------------------------
# The command: exit codes, dry run, matrix


@pytest.mark.parametrize("machine, code, message", [
    (fakes.no_driver(), facts.EXIT_NO_LIBRARY, "NVML cannot start: NVML Shared Library Not Found"),
    (fakes.no_gpus(), facts.EXIT_NO_GPUS, "NVML sees no GPUs on this node"),
], ids=["driver library missing", "no GPUs"])
def test_no_driver_or_no_gpu_is_one_line_and_an_exit_code(machine, code, message, capsys):
    assert command.run(parse(["--dry-run"]), nvml=fakes.fake_nvml(machine)) == code
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err and "Traceback" not in err


def test_all_gpus_unreadable_is_an_nvml_error(capsys):
    machine = fakes.pcie_bridged_pairs()
    machine.lose = {i: "nvmlDeviceGetName" for i in range(4)}
    assert command.run(parse(["--dry-run"]), nvml=fakes.fake_nvml(machine)) == facts.EXIT_NVML
    assert "NVML could not read any of the 4 GPUs: GPU is lost" in capsys.readouterr().err


def test_dry_run_prints_what_it_would_publish_without_a_node_or_api(capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert command.run(parse(["--dry-run"]), nvml=fakes.fake_nvml(fakes.gb200_nvl72_tray())) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION] == "0-3"
    assert printed["metadata"]["labels"][CLIQUE_LABEL].startswith(fakes.GB200_CLUSTER_UUID)


def test_print_matrix_looks_like_nvidia_smi_topo(capsys):
    assert command.run(parse(["--print-matrix"]), nvml=fakes.fake_nvml(fakes.dgx_h100())) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [f"GPU{i}" for i in range(8)] + ["CPU", "Affinity", "NUMA", "Affinity"]
    assert lines[1].split() == ["GPU0", "X"] + ["NV18"] * 7 + ["0-55,112-167", "0"]
    assert lines[8].split() == ["GPU7"] + ["NV18"] * 7 + ["X", "56-111,168-223", "1"]
    assert "GPU0: NVIDIA H100 80GB HBM3 (GPU-" in "\n".join(lines)


def test_one_h100_in_a_vm_prints_and_publishes_what_the_real_one_did(capsys):
    """Against what `discover` printed on a real H100 passed through to a VM (tests/fixtures/discover,
    27 Nov 2026, through the real pynvml), from the fake modelled on that machine's NVML answers."""
    captured = pathlib.Path(__file__).parents[1] / "fixtures" / "discover"
    assert command.run(parse(["--print-matrix"]), nvml=fakes.fake_nvml(fakes.h100_alone_in_a_vm())) == 0
    assert capsys.readouterr().out == (captured / "h100-vm-print-matrix.txt").read_text()
    assert command.run(parse(["--dry-run", "--node", "h100-0"]), nvml=fakes.fake_nvml(fakes.h100_alone_in_a_vm())) == 0
    printed = capsys.readouterr()
    assert (json.loads(printed.out), printed.err) == (json.loads((captured / "h100-vm-dry-run.json").read_text()), "")


def test_fabric_manager_down_is_explained(capsys):
    command.run(parse(["--dry-run"]), nvml=fakes.fake_nvml(fakes.dgx_h100(fabric_manager=False)))
    assert capsys.readouterr().err == ("discover: GPUs 0-7 have NVLinks but NVML reports P2P over NVLink not "
                                       "supported for 28 pair(s) (fabric manager not running?); those links are "
                                       "left out of the NVLink domains\n")


def test_publishing_needs_a_node_name(capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert command.run(parse([]), nvml=fakes.fake_nvml(fakes.dgx_h100())) == facts.EXIT_USAGE
    assert "no node name: pass --node or set NODE_NAME" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf"])
def test_interval_must_be_positive(value, capsys):
    with pytest.raises(SystemExit):
        parse(["--interval", value])
    assert f"argument --interval: {value!r} is not a positive number of seconds" in capsys.readouterr().err


def test_register_adds_discover_with_run_as_its_function():
    args = parse(["--node", "gpu-1", "--interval", "30", "--kubeconfig", "/k"])
    assert (args.func, args.node, args.interval, args.kubeconfig, args.dry_run) == (command.run, "gpu-1", 30.0,
                                                                                    "/k", False)


# ---------------------------------------------------------------------------------------------
# Publishing through the real kubernetes client to a local API server


class FakeApiServer(ThreadingHTTPServer):
    """GET and merge-PATCH /api/v1/nodes/NAME on 127.0.0.1, recording each request."""

    def __init__(self, nodes: dict[str, dict]) -> None:
        super().__init__(("127.0.0.1", 0), _NodeHandler)
        self.nodes = nodes
        self.requests: list[tuple[str, str, str | None, dict | None]] = []
        self.fail_next = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            target[key] = _merge(dict(target.get(key) or {}), value)
        else:
            target[key] = value
    return target


class _NodeHandler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _node(self):
        name = self.path.split("?")[0].removeprefix("/api/v1/nodes/")
        return name, self.server.nodes.get(name)

    def _handle(self, body: dict | None) -> None:
        self.server.requests.append((self.command, self.path, self.headers.get("Content-Type"), body))
        name, node = self._node()
        if self.server.fail_next:
            self.server.fail_next -= 1
            return self._reply(500, {"kind": "Status", "status": "Failure", "code": 500})
        if node is None:
            return self._reply(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                                     "message": f'nodes "{name}" not found'})
        if body is not None:
            _merge(node, body)
        self._reply(200, node)

    def do_GET(self) -> None:
        self._handle(None)

    def do_PATCH(self) -> None:
        self._handle(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))


@pytest.fixture
def api_server():
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "labels": {"kubernetes.io/hostname": "gpu-1", CLIQUE_LABEL: "stale.7"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", UNREADABLE_ANNOTATION: "5"}}}
    server = FakeApiServer({"gpu-1": node})
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def kubeconfig(api_server, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "local", "cluster": {"server": api_server.url}}],
        "users": [{"name": "agent", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "test", "context": {"cluster": "local", "user": "agent"}}]}))
    return str(path)


def _patches(server: FakeApiServer) -> list:
    return [r for r in server.requests if r[0] == "PATCH"]


def test_publish_patches_only_owned_keys_that_changed(api_server, kubeconfig, monkeypatch, capsys):
    monkeypatch.setenv("NODE_NAME", "gpu-1")
    assert command.run(parse(["--kubeconfig", kubeconfig]), nvml=fakes.fake_nvml(fakes.dgx_h100())) == 0
    [(_, path, content_type, body)] = _patches(api_server)
    assert (path, content_type) == ("/api/v1/nodes/gpu-1", "application/merge-patch+json")
    assert body["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION] == "0-7"
    assert body["metadata"]["annotations"][UNREADABLE_ANNOTATION] is None  # stale owned keys are removed
    assert body["metadata"]["labels"] == {LINK_LABEL: "nvswitch", DOMAIN_SIZE_LABEL: "8", CLIQUE_LABEL: None}
    metadata = api_server.nodes["gpu-1"]["metadata"]
    assert metadata["annotations"]["node.alpha.kubernetes.io/ttl"] == "0"  # other keys untouched
    assert metadata["labels"]["kubernetes.io/hostname"] == "gpu-1"
    assert "node gpu-1: patched" in capsys.readouterr().err

    assert command.run(parse(["--node", "gpu-1", "--kubeconfig", kubeconfig]),
                         nvml=fakes.fake_nvml(fakes.dgx_h100())) == 0
    assert len(_patches(api_server)) == 1  # nothing changed: no second patch
    assert "node gpu-1: up to date" in capsys.readouterr().err


def test_unknown_node_is_an_api_error(api_server, kubeconfig, capsys):
    assert command.run(parse(["--node", "gpu-9", "--kubeconfig", kubeconfig]),
                         nvml=fakes.fake_nvml(fakes.dgx_h100())) == facts.EXIT_API
    err = capsys.readouterr().err
    assert "Kubernetes API: GET node gpu-9: 404" in err and err.count("\n") == 1


def test_bad_kubeconfig_is_an_api_error(tmp_path, capsys):
    missing = str(tmp_path / "nope")
    assert command.run(parse(["--node", "gpu-1", "--kubeconfig", missing]),
                         nvml=fakes.fake_nvml(fakes.dgx_h100())) == facts.EXIT_API
    assert f"Kubernetes kubeconfig {missing}:" in capsys.readouterr().err


class Rounds:
    """Wraps a fake NVML module: counts rounds by nvmlInit, runs `before[n]` as round n starts, and
    sets `stop` once the last round has started, so the loop ends after it."""

    def __init__(self, module, stop: threading.Event, rounds: int, before: dict) -> None:
        self.module, self.stop, self.rounds, self.before = module, stop, rounds, before
        self.started = 0

    def __getattr__(self, name):
        return getattr(self.module, name)

    def nvmlInit(self):
        self.started += 1
        self.before.get(self.started, lambda: None)()
        if self.started == self.rounds:
            self.stop.set()
        self.module.nvmlInit()


def test_interval_republishes_only_on_change_and_retries_api_errors(api_server, kubeconfig, capsys):
    machine = fakes.dgx_h100()
    stop = threading.Event()
    nvml = Rounds(fakes.fake_nvml(machine), stop, rounds=4, before={
        1: lambda: setattr(api_server, "fail_next", 1),  # the API server errs; the agent carries on
        3: lambda: machine.lose.update({5: "nvmlDeviceGetName"}),
    })
    args = parse(["--node", "gpu-1", "--kubeconfig", kubeconfig, "--interval", "0.001"])
    assert command.run(args, nvml=nvml, stop=stop) == 0
    assert nvml.started == 4
    bodies = [body for *_, body in _patches(api_server)]
    assert len(bodies) == 2  # round 2 publishes, round 3 publishes GPU 5 lost, round 4 changes nothing
    assert bodies[1]["metadata"]["annotations"][UNREADABLE_ANNOTATION] == "5"
    assert "Kubernetes API: GET node gpu-1: 500 Internal Server Error; retrying in 0.001s" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# End to end: the placement core reads what discovery published

def published_node(machine: fakes.FakeMachine, product: str) -> dict:
    """The Node as it looks once discovery has patched it (product label as GFD writes it)."""
    published = discover(machine)
    labels = {"topology.kubernetes.io/zone": "zone-a", "topology.scheduler/spine": "spine-1",
              "topology.scheduler/leaf": "leaf-1", **published.labels}
    return make_node("gpu-1", labels, len(machine.gpus), product, annotations=dict(published.annotations))


def place_one_pod(node: dict, gpus: int, busy: str | None = None):
    """Place a single pod of `gpus` GPUs on `node`, where a running pod may hold the GPU set `busy`."""
    pods = [make_pod("running", "gpu-1", len(parse_nvlink_domains(busy)[0]),
                     annotations={GPU_IDS_ANNOTATION: busy})] if busy else []
    index = index_of(Config(), [node], pods)
    return place(index, PlacementRequest(workload="Pod ml/trainer", pods=1, gpus_per_pod=gpus))


NVL, PCIE = Interconnect.NVLINK, Interconnect.PCIE
PLACEMENTS = [
    # machine, GFD product label, GPU set a running pod holds, GPUs asked, GPU set placed, link inside the pod
    (fakes.dgx_h100, "NVIDIA-H100-80GB-HBM3", None, 8, (0, 1, 2, 3, 4, 5, 6, 7), NVL),
    (fakes.dgx_h100, "NVIDIA-H100-80GB-HBM3", None, 4, (0, 1, 2, 3), NVL),
    (fakes.dgx_h100, "NVIDIA-H100-80GB-HBM3", None, 2, (0, 1), NVL),
    (fakes.hgx_a100, "NVIDIA-A100-SXM4-80GB", None, 8, (0, 1, 2, 3, 4, 5, 6, 7), NVL),
    (fakes.hgx_a100, "NVIDIA-A100-SXM4-80GB", "0-1", 4, (2, 3, 4, 5), NVL),
    (fakes.hgx_a100, "NVIDIA-A100-SXM4-80GB", None, 2, (0, 1), NVL),
    (fakes.pcie_bridged_pairs, "NVIDIA-H100-PCIe", None, 4, (0, 1, 2, 3), PCIE),
    (fakes.pcie_bridged_pairs, "NVIDIA-H100-PCIe", "0", 2, (2, 3), NVL),
    (lambda: fakes.pcie_bridged_pairs(((0, 2), (1, 3))), "NVIDIA-H100-PCIe", "0", 2, (1, 3), NVL),
    (fakes.two_nvlink_islands, "NVIDIA-A100-SXM4-40GB", None, 8, (0, 1, 2, 3, 4, 5, 6, 7), PCIE),
    (fakes.two_nvlink_islands, "NVIDIA-A100-SXM4-40GB", "0-1", 4, (4, 5, 6, 7), NVL),
    (fakes.two_nvlink_islands, "NVIDIA-A100-SXM4-40GB", "0", 2, (1, 2), NVL),  # keeps 4-7 whole
    (fakes.gb200_nvl72_tray, "NVIDIA-GB200", None, 4, (0, 1, 2, 3), NVL),
    (fakes.gb200_nvl72_tray, "NVIDIA-GB200", "3", 2, (0, 1), NVL),
]


@pytest.mark.parametrize("machine, product, busy, gpus, placed, link", [
    pytest.param(*case, id=f"{case[0]().name}: {case[3]} GPUs" + (f" beside a pod on {case[2]}" if case[2] else ""))
    for case in PLACEMENTS])
def test_placement_picks_gpu_sets_from_the_published_domains(machine, product, busy, gpus, placed, link):
    decision = place_one_pod(published_node(machine(), product), gpus, busy)
    assert decision.outcome is Outcome.PLACED, decision.reasons
    assert decision.gpu_ids == placed
    assert decision.assignment[0].interconnect is link


@pytest.mark.parametrize("machine, product", [(fakes.pcie_bridged_pairs, "NVIDIA-H100-PCIe"),
                                              (fakes.gb200_nvl72_tray, "NVIDIA-GB200")], ids=["PCIe", "GB200 tray"])
def test_placement_never_puts_8_gpus_on_a_4_gpu_node(machine, product):
    decision = place_one_pod(published_node(machine(), product), 8)
    assert decision.outcome is Outcome.NEVER and decision.code == EXCEEDS_CLUSTER


def test_without_discovery_the_product_table_would_split_an_island_board_wrongly():
    """Why discovery matters: the A100 SXM profile assumes one 8-GPU NVSwitch domain."""
    node = published_node(fakes.two_nvlink_islands(), "NVIDIA-A100-SXM4-40GB")
    del node["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION]
    decision = place_one_pod(node, 4, busy="0-1")
    assert decision.gpu_ids == (2, 3, 4, 5)  # crosses the two islands, yet counted as NVLink
    assert decision.assignment[0].interconnect is NVL


@pytest.mark.parametrize("raw, normal", [
    ("00000000:18:00.0", "00000000:18:00.0"),
    (b"0000:5d:00.0", "00000000:5D:00.0"),
    ("00000009:01:00.0", "00000009:01:00.0"),
    ("", ""),
], ids=["NVML 13 form", "older bytes, short domain", "GB200 domain", "empty stays itself"])
def test_bus_ids_compare_in_one_form(raw, normal):
    assert nvml_reading.normalize_bus_id(raw) == normal


@pytest.mark.parametrize("call", ["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetMemoryAffinity"])
def test_a_driver_without_an_optional_call_still_publishes_the_rest(call):
    module = fakes.fake_nvml(fakes.gb200_nvl72_tray())

    def missing(*args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    setattr(module, call, missing)
    published = derive.publication(nvml_reading.read_node(module))
    assert published.annotations[NVLINK_DOMAINS_ANNOTATION] == "0-3"
    assert (CLIQUE_LABEL in published.labels) == (call != "nvmlDeviceGetGpuFabricInfoV")
    assert (published.annotations[NUMA_ANNOTATION] == "") == (call == "nvmlDeviceGetMemoryAffinity")


def test_unreachable_api_server_is_an_api_error(api_server, kubeconfig, capsys):
    api_server.shutdown()
    api_server.server_close()  # the port now refuses connections
    assert command.run(parse(["--node", "gpu-1", "--kubeconfig", kubeconfig]),
                         nvml=fakes.fake_nvml(fakes.dgx_h100())) == facts.EXIT_API
    err = capsys.readouterr().err
    assert "Kubernetes API: GET node gpu-1: MaxRetryError" in err and err.count("\n") == 1
