"""`topology-webhook discover`: read the node, derive, print or publish, once or every interval."""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from typing import Any

from .derive import format_matrix, format_publication, publication, unusable_nvlinks
from .facts import EXIT_OK, EXIT_USAGE, DiscoveryError
from .nvml import Nvml, load_nvml, read_node
from .publish import NodeApi, publish


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "discover", help="read this node's GPU topology with NVML and publish it on the Node",
        description="Read GPUs, NVLinks, P2P, PCIe and NUMA topology with NVML; publish NVLink domains, "
                    "the link matrix and labels on this node. Exit codes: 0 ok, 2 bad arguments or no "
                    "node name, 3 no NVML library or driver, 4 no GPUs, 5 NVML error, 6 Kubernetes API error.")
    parser.add_argument("--node", help="this node's name (default: env NODE_NAME)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be published; change nothing")
    parser.add_argument("--interval", type=_seconds, metavar="SECONDS",
                        help="keep running, re-reading and publishing every SECONDS (default: once)")
    parser.add_argument("--print-matrix", action="store_true",
                        help="print the matrix in the style of `nvidia-smi topo -m` instead of publishing")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.set_defaults(func=run)
    return parser


def _say(message: str) -> None:
    print(f"discover: {message}", file=sys.stderr, flush=True)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    return stop


def run(args: argparse.Namespace, nvml: Nvml | None = None, stop: threading.Event | None = None) -> int:
    """One discovery (or one every --interval seconds until SIGTERM or `stop`); returns the exit code.

    `nvml` replaces the real bindings (tests pass fakes). With --interval, Kubernetes API errors are
    reported and retried at the next round; NVML failures end the run with their exit code."""
    publishing = not (args.dry_run or args.print_matrix)
    node_name = getattr(args, "node", None) or os.environ.get("NODE_NAME")
    try:
        if publishing and not node_name:
            raise DiscoveryError("no node name: pass --node or set NODE_NAME (the downward API's "
                                 "spec.nodeName)", EXIT_USAGE)
        nvml = nvml or load_nvml()
        api = NodeApi(getattr(args, "kubeconfig", None)) if publishing else None
        if args.interval and stop is None:
            stop = _stop_on_signals()
        while True:
            topology = read_node(nvml)
            for warning in topology.warnings + unusable_nvlinks(topology):
                _say(warning)
            wanted = publication(topology)
            if args.print_matrix:
                print(format_matrix(topology), flush=True)
            if args.dry_run:
                print(format_publication(node_name, wanted), flush=True)
            if api is not None and node_name:  # publishing: checked above that it has a name
                try:
                    patch = publish(api, node_name, wanted)
                    _say(f"node {node_name}: " + (f"patched {json.dumps(patch, sort_keys=True)}" if patch
                                                   else "up to date"))
                except DiscoveryError as err:
                    if not args.interval:
                        raise
                    _say(f"{err}; retrying in {args.interval:g}s")
            if not args.interval or stop is None or stop.wait(args.interval):
                return EXIT_OK
    except DiscoveryError as err:
        _say(str(err))
        return err.exit_code
