"""Fake NVML backends: module objects with the API of `pynvml` from nvidia-ml-py 13.615.71, each
modelled on a real machine, so discovery's real code path runs without a GPU.

A fake module carries the real bindings' constants, ctypes structures and exception classes
(importing pynvml loads no library), and functions with the real names and signatures that
behave as the driver does where it matters:
- every call but nvmlInit needs an initialised library (NVMLError_Uninitialized otherwise);
- a missing driver library makes nvmlInit raise NVMLError_LibraryNotFound;
- NVLink calls: NVMLError_NotSupported on a GPU without NVLink, NVMLError_InvalidArgument for a
  link index the GPU does not have (iterating to NVML_NVLINK_MAX_LINKS = 36 is normal);
- on NVSwitch systems a link's remote device type is SWITCH and its remote PCI info is the
  switch's, never the peer GPU's;
- nvmlDeviceGetP2PStatus rejects a tuple caps index as ctypes does (NVML_P2P_CAPS_INDEX_READ is
  `(0,)` in this release);
- nvmlDeviceGetGpuFabricInfoV fills a c_nvmlGpuFabricInfoV_t passed by ctypes.byref and checks
  its version field;
- `bytes_bus_ids=True` imitates older bindings: PCI bus IDs as bytes with a 4-digit domain.

Machine facts (bus IDs, link counts, NUMA and CPU affinity) follow published `nvidia-smi topo -m`
and `lspci` captures of each system; NVSwitch PCI addresses are illustrative.
"""
from __future__ import annotations

import ctypes
import types
import uuid
from dataclasses import dataclass, field
from typing import Callable

import pynvml as real

GPU, SWITCH = real.NVML_NVLINK_DEVICE_TYPE_GPU, real.NVML_NVLINK_DEVICE_TYPE_SWITCH
PXB, NODE, SYS = real.NVML_TOPOLOGY_MULTIPLE, real.NVML_TOPOLOGY_NODE, real.NVML_TOPOLOGY_SYSTEM
P2P_OK, P2P_CNS, P2P_NS = real.NVML_P2P_STATUS_OK, real.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED, \
    real.NVML_P2P_STATUS_NOT_SUPPORTED
CAPS_NVLINK = real.NVML_P2P_CAPS_INDEX_NVLINK
FABRIC_COMPLETED = real.NVML_GPU_FABRIC_STATE_COMPLETED
FABRIC_NOT_SUPPORTED = real.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED


@dataclass
class FakeGpu:
    name: str
    bus_id: str  # 8-digit domain form, as NVML 13 reports it
    uuid: str = ""
    link_slots: int = 0  # NVLinks the chip has; 0 = no NVLink (NotSupported)
    links: dict[int, tuple[int, str | None]] = field(default_factory=dict)  # active link -> (type, remote bus)
    cpus: tuple[int, ...] = ()
    numa: tuple[int, ...] = ()
    fabric: tuple[int, bytes, int] | None = None  # (state, cluster UUID bytes, clique); None = NotSupported


@dataclass
class FakeMachine:
    name: str
    gpus: list[FakeGpu]
    ancestor: Callable[[int, int], int] = lambda a, b: SYS
    p2p: Callable[[int, int, int], int] = lambda a, b, caps: P2P_OK
    library: bool = True
    lose: dict[int, str] = field(default_factory=dict)  # GPU -> first NVML call that finds it lost

    def __post_init__(self) -> None:
        for index, gpu in enumerate(self.gpus):
            gpu.uuid = gpu.uuid or f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.name}/{index}')}"


class FakeHandle:
    """Stands in for the opaque c_nvmlDevice_t pointer."""

    def __init__(self, index: int) -> None:
        self.index = index


def _raise(code: int):
    raise real.NVMLError(code)  # NVMLError(code) builds the matching subclass, as the bindings do


def _cpu_set(*ranges: tuple[int, int]) -> tuple[int, ...]:
    return tuple(cpu for low, high in ranges for cpu in range(low, high + 1))


def _bitmask(bits: tuple[int, ...], words: int):
    array = (ctypes.c_ulonglong * words)()
    for bit in bits:
        if bit < 64 * words:
            array[bit // 64] |= 1 << (bit % 64)
    return array


class _Backend:
    """The fake functions; bound methods of one instance become the module's functions."""

    def __init__(self, machine: FakeMachine, bytes_bus_ids: bool) -> None:
        self.machine = machine
        self.bytes_bus_ids = bytes_bus_ids
        self.initialised = 0
        self.lost: set[int] = set()
        self.calls: list[str] = []

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        if not self.initialised:
            _raise(real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, call: str, handle) -> FakeGpu:
        self._enter(call)
        if not isinstance(handle, FakeHandle):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        if self.machine.lose.get(handle.index) == call:
            self.lost.add(handle.index)
        if handle.index in self.lost:
            _raise(real.NVML_ERROR_GPU_IS_LOST)
        return self.machine.gpus[handle.index]

    def _link(self, call: str, handle, link: int) -> FakeGpu:
        gpu = self._gpu(call, handle)
        if not gpu.link_slots:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < min(gpu.link_slots, real.NVML_NVLINK_MAX_LINKS):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def _pci(self, bus_id: str):
        if self.bytes_bus_ids:
            return types.SimpleNamespace(busId=bus_id[4:].encode())  # 0000:18:00.0 as bytes
        info = real.nvmlPciInfo_t()
        info.busId = bus_id.encode()
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        return info

    # -- library
    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if not self.machine.library:
            _raise(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised += 1

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.machine.gpus):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # -- one GPU
    def nvmlDeviceGetName(self, handle):
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle):
        return self._pci(self._gpu("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetCpuAffinity(self, handle, cpuSetSize):
        gpu = self._gpu("nvmlDeviceGetCpuAffinity", handle)
        return _bitmask(gpu.cpus, cpuSetSize)

    def nvmlDeviceGetMemoryAffinity(self, handle, nodeSetSize, scope):
        gpu = self._gpu("nvmlDeviceGetMemoryAffinity", handle)
        if scope not in (real.NVML_AFFINITY_SCOPE_NODE, real.NVML_AFFINITY_SCOPE_SOCKET):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return _bitmask(gpu.numa, nodeSetSize)

    def nvmlDeviceGetGpuFabricInfoV(self, device, gpuFabricInfo):
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfoV", device)
        info = getattr(gpuFabricInfo, "_obj", None)  # what ctypes.byref(struct) wraps
        if not isinstance(info, real.c_nvmlGpuFabricInfoV_t):  # the v2 struct, by either name
            raise TypeError("nvmlDeviceGetGpuFabricInfoV needs ctypes.byref(c_nvmlGpuFabricInfoV_t())")
        if info.version != real.nvmlGpuFabricInfo_v2:
            _raise(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if gpu.fabric is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        info.state, raw, info.cliqueId = gpu.fabric
        info.status = real.NVML_SUCCESS
        ctypes.memmove(info.clusterUuid, raw, len(raw))
        return real.NVML_SUCCESS

    # -- NVLink
    def nvmlDeviceGetNvLinkState(self, device, link):
        gpu = self._link("nvmlDeviceGetNvLinkState", device, link)
        return real.NVML_FEATURE_ENABLED if link in gpu.links else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        gpu = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if link not in gpu.links:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device, link):
        gpu = self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if link not in gpu.links or gpu.links[link][1] is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return self._pci(gpu.links[link][1])

    # -- pairs
    def nvmlDeviceGetTopologyCommonAncestor(self, device1, device2):
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        return self.machine.ancestor(device1.index, device2.index)

    def nvmlDeviceGetP2PStatus(self, device1, device2, p2pIndex):
        if not isinstance(p2pIndex, int):  # what ctypes says when handed NVML_P2P_CAPS_INDEX_READ == (0,)
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
        self._gpu("nvmlDeviceGetP2PStatus", device1)
        self._gpu("nvmlDeviceGetP2PStatus", device2)
        if not 0 <= p2pIndex <= real.NVML_P2P_CAPS_INDEX_UNKNOWN:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return self.machine.p2p(device1.index, device2.index, p2pIndex)


FUNCTIONS = tuple(name for name in vars(_Backend) if name.startswith("nvml"))
_BORROWED_PREFIXES = ("NVML_", "NVMLError", "c_nvml", "nvmlPciInfo", "nvmlGpuFabricInfo")


def fake_nvml(machine: FakeMachine, bytes_bus_ids: bool = False) -> types.ModuleType:
    """A module that answers like `pynvml` on `machine`; `module.fake` is the backend (calls, state)."""
    module = types.ModuleType("pynvml", f"fake NVML: {machine.name}")
    for name in dir(real):
        if name.startswith(_BORROWED_PREFIXES):
            setattr(module, name, getattr(real, name))
    backend = _Backend(machine, bytes_bus_ids)
    for name in FUNCTIONS:
        setattr(module, name, getattr(backend, name))
    module.fake = backend
    return module


# ---------------------------------------------------------------------------------------------
# Machines


def _switch_links(per_switch: tuple[int, ...], switches: tuple[str | None, ...]) -> dict:
    """Links in order, `per_switch[k]` of them to switch k."""
    links, link = {}, 0
    for count, switch in zip(per_switch, switches):
        for _ in range(count):
            links[link] = (SWITCH, switch)
            link += 1
    return links


def _by_group(groups: tuple[tuple[int, ...], ...], inside: int, across: int) -> Callable[[int, int], int]:
    def value(a: int, b: int) -> int:
        return inside if any(a in g and b in g for g in groups) else across
    return value


def dgx_h100(fabric_manager: bool = True) -> FakeMachine:
    """DGX H100: 8 x H100 SXM5 on four NVSwitch chips (18 NVLink4 links each, split 5-4-4-5), two
    Xeon 8480C sockets with 56 cores x 2 threads; GPUs 0-3 on NUMA 0, 4-7 on NUMA 1. Hopper reports a
    COMPLETED fabric registration with a zero cluster UUID (single-node NVSwitch, not MNNVL).
    Without fabric manager NVML still lists the links but denies P2P over NVLink."""
    switches = ("00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0")
    buses = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
    gpus = [FakeGpu("NVIDIA H100 80GB HBM3", f"00000000:{bus}:00.0", link_slots=18,
                    links=_switch_links((5, 4, 4, 5), switches),
                    cpus=_cpu_set((0, 55), (112, 167)) if i < 4 else _cpu_set((56, 111), (168, 223)),
                    numa=(0,) if i < 4 else (1,), fabric=(FABRIC_COMPLETED, bytes(16), 0))
            for i, bus in enumerate(buses)]
    sockets = ((0, 1, 2, 3), (4, 5, 6, 7))
    nvlink_p2p = P2P_OK if fabric_manager else P2P_NS
    return FakeMachine("dgx-h100", gpus, ancestor=_by_group(sockets, NODE, SYS),
                       p2p=lambda a, b, caps: nvlink_p2p if caps == CAPS_NVLINK else P2P_OK)


def hgx_a100() -> FakeMachine:
    """HGX A100 8-GPU (DGX A100 layout): A100 SXM4 with 12 NVLink3 links, two to each of six NVSwitch
    chips; two EPYC 7742 in NPS4, so GPU pairs share a PCIe switch and one NUMA node each
    (GPUs 0-1 NUMA 3, 2-3 NUMA 1, 4-5 NUMA 7, 6-7 NUMA 5). Ampere has no fabric info."""
    switches = tuple(f"00000000:{bus}:00.0" for bus in ("C4", "C5", "C6", "C7", "C8", "C9"))
    buses = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
    numa = (3, 3, 1, 1, 7, 7, 5, 5)
    cpus = {3: ((48, 63), (176, 191)), 1: ((16, 31), (144, 159)), 7: ((112, 127), (240, 255)),
            5: ((80, 95), (208, 223))}
    gpus = [FakeGpu("NVIDIA A100-SXM4-80GB", f"00000000:{bus}:00.0", link_slots=12,
                    links=_switch_links((2,) * 6, switches), cpus=_cpu_set(*cpus[numa[i]]), numa=(numa[i],))
            for i, bus in enumerate(buses)]
    return FakeMachine("hgx-a100", gpus, ancestor=_by_group(((0, 1), (2, 3), (4, 5), (6, 7)), PXB, SYS))


def pcie_bridged_pairs(bridges: tuple[tuple[int, int], ...] = ((0, 1), (2, 3))) -> FakeMachine:
    """A 2-socket PCIe server with 4 x H100 PCIe, each GPU on its own root port (GPUs 0-1 on socket 0,
    2-3 on socket 1), and NVLink bridges joining `bridges` (three bridges: 12 links per pair; the
    chip's other 6 links stay inactive). P2P reads across sockets are not supported by the chipset."""
    buses = ("00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0")
    peer = {a: b for pair in bridges for a, b in (pair, pair[::-1])}
    gpus = [FakeGpu("NVIDIA H100 PCIe", bus, link_slots=18,
                    links={link: (GPU, buses[peer[i]]) for link in range(12)} if i in peer else {},
                    cpus=_cpu_set((0, 31), (64, 95)) if i < 2 else _cpu_set((32, 63), (96, 127)),
                    numa=(0,) if i < 2 else (1,), fabric=(FABRIC_NOT_SUPPORTED, bytes(16), 0))
            for i, bus in enumerate(buses)]
    sockets = ((0, 1), (2, 3))
    same_socket = _by_group(sockets, True, False)

    def p2p(a: int, b: int, caps: int) -> int:
        if caps == CAPS_NVLINK:
            return P2P_OK if peer.get(a) == b else P2P_NS
        return P2P_OK if same_socket(a, b) else P2P_CNS

    return FakeMachine("pcie-bridged", gpus, ancestor=_by_group(sockets, NODE, SYS), p2p=p2p)


def two_nvlink_islands() -> FakeMachine:
    """Two HGX A100 4-GPU boards in one 2-socket server: inside a board every GPU has 4 direct NVLinks
    to each of its 3 peers (NV4, no switch); the boards meet only over PCIe and the CPUs (SYS)."""
    buses = tuple(f"00000000:{bus}:00.0" for bus in ("01", "21", "41", "61", "81", "A1", "C1", "E1"))
    boards = ((0, 1, 2, 3), (4, 5, 6, 7))
    gpus = []
    for i, bus in enumerate(buses):
        board = boards[i // 4]
        peers = [p for p in board if p != i]
        links = {k * 4 + n: (GPU, buses[p]) for k, p in enumerate(peers) for n in range(4)}
        gpus.append(FakeGpu("NVIDIA A100-SXM4-40GB", bus, link_slots=12, links=links,
                            cpus=_cpu_set((0, 63), (128, 191)) if i < 4 else _cpu_set((64, 127), (192, 255)),
                            numa=(i // 4,)))
    same_board = _by_group(boards, True, False)
    return FakeMachine("nvlink-islands", gpus, ancestor=_by_group(boards, NODE, SYS),
                       p2p=lambda a, b, caps: P2P_OK if caps != CAPS_NVLINK or same_board(a, b) else P2P_NS)


GB200_CLUSTER_UUID = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
GB200_CLIQUE = 1


def gb200_nvl72_tray() -> FakeMachine:
    """A GB200 NVL72 compute tray: two Grace CPUs (72 cores each) with two B200 GPUs apiece over C2C;
    each GPU has 18 NVLink5 links to the rack's NVSwitch trays, which are not PCI devices of this
    host (remote PCI info not supported); fabric registration COMPLETED with the rack's cluster UUID
    and clique."""
    fabric = (FABRIC_COMPLETED, uuid.UUID(GB200_CLUSTER_UUID).bytes, GB200_CLIQUE)
    buses = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")
    gpus = [FakeGpu("NVIDIA GB200", bus, link_slots=18, links={link: (SWITCH, None) for link in range(18)},
                    cpus=_cpu_set((0, 71)) if i < 2 else _cpu_set((72, 143)), numa=(i // 2,), fabric=fabric)
            for i, bus in enumerate(buses)]
    return FakeMachine("gb200-tray", gpus, ancestor=_by_group(((0, 1), (2, 3)), NODE, SYS))


def h100_alone_in_a_vm() -> FakeMachine:
    """One H100 SXM5 passed through to a 16-vCPU Firecracker VM, as NVML answered on such a machine
    (27 Nov 2026: driver 580.159.04, nvidia-ml-py 13.580; what `discover` printed there is in
    tests/fixtures/discover/): every NVLink call NotSupported on all 36 link indices (the board's NVSwitches stay
    with the host), fabric info answered with state NOT_SUPPORTED rather than an error, CPUs 0-15
    and NUMA node 0."""
    return FakeMachine("h100-vm", [FakeGpu("NVIDIA H100 80GB HBM3", "00000000:00:06.0",
                                           uuid="GPU-2f10243d-e685-53ce-83e4-2c2d01b7d83b", cpus=_cpu_set((0, 15)),
                                           numa=(0,), fabric=(FABRIC_NOT_SUPPORTED, bytes(16), 0))])


def no_gpus() -> FakeMachine:
    """A CPU node with the driver installed: NVML starts and counts zero GPUs."""
    return FakeMachine("no-gpus", [])


def no_driver() -> FakeMachine:
    """A node where libnvidia-ml.so.1 is missing (no driver, or not mounted into the container)."""
    return FakeMachine("no-driver", [], library=False)
