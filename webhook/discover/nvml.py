"""Reading a node through NVML: one small function per fact, every one taking `nvml`, a module with
the pynvml API of nvidia-ml-py (imported lazily by `load_nvml`, never at import time), so tests
pass fake modules modelled on real machines (tests/nvml_fakes.py)."""
from __future__ import annotations

import ctypes
import uuid as uuidlib
from typing import Any, Callable, Iterable

from .facts import (EXIT_NO_GPUS, EXIT_NO_LIBRARY, EXIT_NVML, DiscoveryError, Fabric, GpuFacts, NodeTopology, NvLink,
                    PairFacts)

# NVML constants used by value: the same in every nvidia-ml-py release, and NVML_P2P_CAPS_INDEX_READ
# is the tuple (0,) in 13.615.71 (a trailing comma), which ctypes refuses as an argument.
P2P_CAPS_READ = 0
P2P_CAPS_NVLINK = 2
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_SWITCH = 2
FABRIC_STATE_COMPLETED = 3
CPU_SET_WORDS = 64  # 4096 CPUs: bitmask words of 64 CPUs each; NVML fills what the host has
NUMA_SET_WORDS = 4  # 256 NUMA nodes
# The pynvml module, or a fake of it (tests/nvml_fakes.py), and a device handle it gave: the
# bindings carry no type hints, so neither can be typed closer.
Nvml = Any
Handle = Any


def load_nvml() -> Nvml:
    """The real NVML bindings (module `pynvml` of nvidia-ml-py), imported only when discovery runs."""
    try:
        import pynvml
    except ImportError:
        raise DiscoveryError("Python package nvidia-ml-py is not installed (module pynvml)", EXIT_NO_LIBRARY) from None
    return pynvml


def _text(value: str | bytes) -> str:
    # nvidia-ml-py decodes strings since 11.x; older bindings and some structures hand back bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_bus_id(value: str | bytes) -> str:
    """`0000:18:00.0` or b`00000000:18:00.0` -> `00000000:18:00.0`, so bus IDs compare equal.
    Text that is not a bus ID comes back as given (upper-cased): it can only equal itself."""
    text = _text(value).strip().upper()
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function, 16):X}"
    except ValueError:
        return text


def _bits(words: Iterable[int]) -> tuple[int, ...]:
    """Set bit positions of an NVML bitmask array (64 bits per c_ulonglong word)."""
    return tuple(w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1)


def read_nvlinks(nvml: Nvml, handle: Handle) -> tuple[NvLink, ...]:
    links = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue  # no such link on this GPU, or no NVLink at all
        kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        remote = {NVLINK_REMOTE_GPU: "gpu", NVLINK_REMOTE_SWITCH: "switch"}.get(kind, "other")
        try:
            bus_id = normalize_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except nvml.NVMLError_NotSupported:
            bus_id = None  # e.g. an NVSwitch tray outside this host: no PCI address here
        links.append(NvLink(remote, bus_id))
    return tuple(links)


def _absent(nvml: Nvml) -> tuple[type[BaseException], ...]:
    """Errors that mean an optional fact is not there: the GPU lacks it, or the driver predates the call."""
    return nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound


def read_cpu_affinity(nvml: Nvml, handle: Handle) -> tuple[int, ...]:
    try:
        return _bits(nvml.nvmlDeviceGetCpuAffinity(handle, CPU_SET_WORDS))
    except _absent(nvml):
        return ()


def read_numa_nodes(nvml: Nvml, handle: Handle) -> tuple[int, ...]:
    try:
        return _bits(nvml.nvmlDeviceGetMemoryAffinity(handle, NUMA_SET_WORDS, nvml.NVML_AFFINITY_SCOPE_NODE))
    except _absent(nvml):
        return ()


def read_fabric(nvml: Nvml, handle: Handle) -> Fabric | None:
    """The GPU's multi-node NVLink fabric: only a COMPLETED registration with a non-zero cluster UUID
    counts (single-node NVSwitch systems report COMPLETED with a zero UUID)."""
    info = nvml.c_nvmlGpuFabricInfoV_t()  # sets the struct version the V call checks
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except _absent(nvml):
        return None
    raw = bytes(info.clusterUuid)
    if info.state != FABRIC_STATE_COMPLETED or info.status != 0 or not any(raw):
        return None
    return Fabric(str(uuidlib.UUID(bytes=raw)), int(info.cliqueId))


def read_gpu(nvml: Nvml, index: int, handle: Handle) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        bus_id=normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
        nvlinks=read_nvlinks(nvml, handle),
        cpus=read_cpu_affinity(nvml, handle),
        numa_nodes=read_numa_nodes(nvml, handle),
        fabric=read_fabric(nvml, handle),
    )


def read_pair(nvml: Nvml, first: Handle, second: Handle) -> tuple[PairFacts, list[str]]:
    """Pairwise facts; a failed call leaves its fact unknown and says why."""
    problems: list[str] = []

    def ask(what: str, call: Callable[..., Any], *call_args: Any) -> Any:
        try:
            return call(*call_args)
        except nvml.NVMLError as err:
            problems.append(f"{what}: {err}")
            return None

    return PairFacts(
        ancestor=ask("topology", nvml.nvmlDeviceGetTopologyCommonAncestor, first, second),
        p2p_read=ask("P2P read", nvml.nvmlDeviceGetP2PStatus, first, second, P2P_CAPS_READ),
        p2p_nvlink=ask("P2P NVLink", nvml.nvmlDeviceGetP2PStatus, first, second, P2P_CAPS_NVLINK),
    ), problems


def _start(nvml: Nvml) -> int:
    """nvmlInit and the GPU count, with NVML's failures turned into exit codes."""
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded) as err:
        raise DiscoveryError(f"NVML cannot start: {err} (is the NVIDIA driver installed and the "
                             f"library mounted into this container?)", EXIT_NO_LIBRARY) from None
    except nvml.NVMLError as err:
        raise DiscoveryError(f"NVML cannot start: {err}", EXIT_NVML) from None
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as err:
        nvml.nvmlShutdown()
        raise DiscoveryError(f"NVML cannot count GPUs: {err}", EXIT_NVML) from None
    if count == 0:
        nvml.nvmlShutdown()
        raise DiscoveryError("NVML sees no GPUs on this node", EXIT_NO_GPUS)
    return count


def read_node(nvml: Nvml) -> NodeTopology:
    """Every fact of this node. A GPU that fails mid-read is reported and left out, not fatal."""
    count = _start(nvml)
    try:
        gpus, handles, unreadable, warnings = [], {}, [], []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(read_gpu(nvml, index, handle))
                handles[index] = handle
            except nvml.NVMLError as err:
                unreadable.append((index, str(err)))
                warnings.append(f"GPU {index} skipped: NVML error while reading it: {err}")
        if not gpus:
            raise DiscoveryError(f"NVML could not read any of the {count} GPUs: {unreadable[0][1]}", EXIT_NVML)
        pairs = {}
        for a in handles:
            for b in handles:
                if a < b:
                    pairs[(a, b)], problems = read_pair(nvml, handles[a], handles[b])
                    warnings.extend(f"GPU {a} and GPU {b}: {p}" for p in problems)
        return NodeTopology(count, tuple(gpus), pairs, tuple(unreadable), tuple(warnings))
    finally:
        nvml.nvmlShutdown()
