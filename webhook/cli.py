"""`topology-webhook` commands: serve, mutate, certs. The only module that wires objects together.

Exit codes: 0 success (every object admitted), 1 some object denied (mutate), 2 usage or input error,
141 stdout closed by its reader before all was written (`| head`: quietly, EXIT_STDOUT_CLOSED).
Other modules add subcommands with one `register(subparsers)` call in `build_parser`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import select
import socket
import sys
import time
import uuid
from typing import TYPE_CHECKING, Callable, Sequence

import yaml

from . import __version__
from . import admission
from .discover import command as discover_command
from .kube import certbootstrap, demo, ungate
from .kube.access import cluster_access
from .kube.shared_claims import DEFAULT_BUDGET_SECONDS
from .kube.clusterview import ApiFeed, own_namespace
from .kube.gatekey import ensure_gate_key
from .kube.kubeclient import api_client_from
from .objects.manifests import ManifestError, read_objects
from .serving import certs, logs
from .serving.app import Readiness, create_app
from .serving.metrics import MULTIPROC_ENV, Metrics, reset_multiprocess_dir
from .serving.metrics_port import METRICS_BACKLOG, start_metrics_server
from .serving.page.render import page_app, write_page
from .serving.page.snapshot import RecentDecisions
from .serving.paths import DEFAULT_PORT
from .serving.server import THREADS_PER_WORKER, ServeOptions, WebhookServer
from .settings.config import Config, ConfigError
from .settings.loading import load_config
from .state.dra import DRA_KINDS, RESOURCE_SLICE_MAX_DEVICES, in_namespace
from .state.growth import is_growth_object
from .state.index import ClusterIndex, out_of_the_collectors_way

PROG = "topology-webhook"
DEV_CERT_DIR = "certs"
DEFAULT_METRICS_BIND = "0.0.0.0:9090"
if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger("webhook.cli")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class UsageError(ValueError):
    """A bad flag value or input file: printed as one line, exit 2."""


# What the input files may hold (docs/reference/cli.md#input-limits): larger files are refused before they
# are parsed, and no object is larger than the apiserver would store.
MiB = 1024 * 1024
CLUSTER_FILE_MAX_BYTES = 64 * MiB  # --nodes, --pods: a cluster of thousands of nodes and their pods
MANIFEST_FILE_MAX_BYTES = 16 * MiB  # each -f file (or stdin)
OBJECT_MAX_BYTES = 3 * MiB  # the apiserver's request body limit: no object it holds is larger


def within_api_limits(path: str, objects: list[dict]) -> list[dict]:
    """The objects, refused (ManifestError naming the file and the object) where the apiserver
    would refuse them: larger than its request limit as JSON, or a ResourceSlice with more devices
    than resource.k8s.io/v1 allows (ResourceSliceMaxDevices)."""
    source = "stdin" if path == "-" else path
    for obj in objects:
        meta = obj.get("metadata") or {}
        namespace = f"{meta['namespace']}/" if meta.get("namespace") else ""
        name = f"{obj['kind']} {namespace}{meta.get('name') or meta.get('generateName') or '?'}"
        try:
            text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            raise ManifestError(f"{source}: {name}: nested too deeply or recursive; no Kubernetes object is") from None
        size = len(text) if len(text) > OBJECT_MAX_BYTES else len(text.encode("utf-8", "surrogatepass"))
        if size > OBJECT_MAX_BYTES:
            raise ManifestError(f"{source}: {name} is {size} bytes as JSON; allowed: at most {OBJECT_MAX_BYTES} "
                                "bytes (3 MiB, the apiserver's request limit)")
        devices = (obj.get("spec") or {}).get("devices") if obj["kind"] == "ResourceSlice" else None
        if isinstance(devices, list) and len(devices) > RESOURCE_SLICE_MAX_DEVICES:
            raise ManifestError(f"{source}: {name}: spec.devices: Too many: {len(devices)}: must have at most "
                                f"{RESOURCE_SLICE_MAX_DEVICES} items")
    return objects


# ----- the cluster view ---------------------------------------------------------------------------

def read_cluster(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Node and Pod objects from --nodes / --pods, each file with any of the DRA kinds mixed in
    (ResourceSlices, DeviceClasses, ResourceClaims, their templates, PodGroups), or the built-in
    demo cluster without --nodes."""
    if not args.nodes:
        if args.pods:
            raise UsageError("--pods needs --nodes (without --nodes the built-in demo cluster is used)")
        return demo.demo_cluster()
    nodes = node_file(args.nodes)
    pods = within_api_limits(args.pods, read_objects(args.pods, kind=("Pod", *DRA_KINDS),
                                                     max_bytes=CLUSTER_FILE_MAX_BYTES)) if args.pods else []
    return nodes, pods


def node_file(path: str) -> list[dict]:
    """Node objects, with the autoscaler objects that say how the cluster can grow among them, as
    `kubectl get nodes,nodepools -o yaml` prints them (plus cluster-autoscaler's status ConfigMap),
    and any of the DRA kinds (state/dra.py), as `kubectl get nodes,resourceslices,deviceclasses`."""
    objects = read_objects(path, max_bytes=CLUSTER_FILE_MAX_BYTES)
    for obj in objects:
        if obj["kind"] != "Node" and obj["kind"] not in DRA_KINDS and not is_growth_object(obj):
            raise ManifestError(f"{path}: {obj['kind']} {(obj.get('metadata') or {}).get('name', '?')} found; this "
                                "file may only hold Node objects, Karpenter NodePools, the ConfigMap "
                                "kube-system/cluster-autoscaler-status and DRA objects (ResourceSlices, "
                                "DeviceClasses...)")
    return within_api_limits(path, objects)


def say_levels(index: ClusterIndex, warn: Callable[[str], None], level: int = logging.INFO) -> None:
    """Which levels `levels: auto` chose from the nodes' labels, and through `warn` why none fit."""
    if index.preset is None:
        return
    log.log(level, "levels: auto chose the %s preset: %s", index.preset, ", ".join(lv.label for lv in index.config.levels))
    if index.levels_warning:
        warn(index.levels_warning)


def file_index(config: Config, cluster: tuple[list[dict], list[dict]]) -> tuple[ClusterIndex, Readiness]:
    """The cluster index and its readiness check from files or the demo: complete at once, so
    always ready."""
    nodes, pods = cluster
    index = ClusterIndex.from_objects(config, nodes, pods)
    for warning in index.inventory_warnings():
        log.warning("%s", warning)
    return index, lambda: (True, "")


def live_source(args: argparse.Namespace) -> bool:
    """Whether serve watches the API: with --kubeconfig, or inside a pod when no --nodes is given."""
    if args.kubeconfig and (args.nodes or args.pods):
        raise UsageError("--kubeconfig watches the cluster; --nodes/--pods read files: give one or the other")
    return bool(args.kubeconfig) or (not args.nodes and bool(os.environ.get("KUBERNETES_SERVICE_HOST")))


# ----- serve --------------------------------------------------------------------------------------

def parse_bind(text: str, flag: str = "--bind", example_port: int = DEFAULT_PORT) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag} {text!r} is not HOST:PORT (for example 0.0.0.0:{example_port} or "
                         f"[::]:{example_port})")
    return host.strip("[]"), int(port)


def bound(flag: str, text: str, address: tuple[str, int]) -> socket.socket:
    """A socket bound to `address` (SO_REUSEADDR, as gunicorn binds), or one clear line now rather
    than gunicorn's five retries: the address is taken or not ours."""
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise UsageError(f"{flag} {text}: cannot listen there ({err.strerror}); another server may hold "
                         f"the port: choose another with {flag} HOST:PORT") from None
    return sock


def self_managed_tls(args: argparse.Namespace) -> certbootstrap.SelfManagedTLS | None:
    """Where --tls-secret keeps the certificates, or None without it."""
    if not args.tls_secret:
        for flag, value in (("--tls-service", args.tls_service), ("--webhook-configuration", args.webhook_configuration)):
            if value:
                raise UsageError(f"{flag} only goes with --tls-secret NAMESPACE/NAME")
        return None
    namespace, _, name = args.tls_secret.partition("/")
    if not (_DNS_LABEL.fullmatch(namespace) and name):
        raise UsageError(f"--tls-secret {args.tls_secret!r} is not NAMESPACE/NAME")
    if not (args.cert and args.key):
        raise UsageError("--tls-secret writes the serving certificate to --cert and --key: give both")
    if not (args.tls_service and _DNS_LABEL.fullmatch(args.tls_service)):
        raise UsageError("--tls-secret needs --tls-service NAME: the Service (in the Secret's namespace) that the "
                         "certificate names")
    if not args.webhook_configuration:
        raise UsageError("--tls-secret needs --webhook-configuration NAME: the MutatingWebhookConfiguration whose "
                         "caBundle gets the CA")
    return certbootstrap.SelfManagedTLS(namespace, name, args.tls_service, args.webhook_configuration,
                                        args.cluster_domain)


def serving_certs(args: argparse.Namespace, target: certbootstrap.SelfManagedTLS | None) -> tuple[str, str]:
    """--cert/--key (first filled from the Secret --tls-secret names), or development certificates
    in ./certs/ (generated once)."""
    if target is not None:
        material = certbootstrap.ensure(api_client_from(args.kubeconfig), target, args.cert, args.key)
        log.info("serving certificate from Secret %s/%s written to %s; caBundle of %s is its CA (sha256 %s)",
                 target.namespace, target.secret, args.cert, target.webhook_configuration, material.ca_fingerprint)
    if args.cert:
        return args.cert, args.key
    paths = certs.ensure_dev_certs(DEV_CERT_DIR)
    log.info("development certificate %s (CA %s; caBundle: base64 -w0 %s)", paths.cert, paths.ca, paths.ca)
    return paths.cert, paths.key


def metrics_dir() -> str | None:
    """PROMETHEUS_MULTIPROC_DIR if set: counters there outlive a restarted worker."""
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        if not os.path.isdir(path):
            raise UsageError(f"{MULTIPROC_ENV}={path!r} is not a directory")
        reset_multiprocess_dir(path)
    return path


def reread(path: str | None, previous: Config) -> Config:
    """The settings file as it is now, or `previous` (logged) when it no longer reads: a SIGHUP
    after a bad edit keeps the webhook serving on the last settings that read."""
    try:
        return load_config(path)
    except ConfigError as err:
        log.error("%s; keeping the settings in use", err)
        return previous


def cmd_serve(args: argparse.Namespace) -> int:
    if args.workers != 1:
        raise UsageError(f"--workers {args.workers}: serve runs exactly 1 worker process, because the cluster "
                         "view and its reservations live in it and a second would book the same GPUs again; "
                         "add replicas instead")
    config = load_config(args.config)
    bind = parse_bind(args.bind)
    metrics_bind = parse_bind(args.metrics_bind, "--metrics-bind", 9090)
    bound("--bind", args.bind, bind).close()  # gunicorn binds it
    # The metrics port is bound here, in the server process, and every worker serves the socket it
    # inherits: a worker started on SIGHUP serves beside the one it replaces instead of failing to bind.
    metrics_listener = bound("--metrics-bind", args.metrics_bind, metrics_bind)
    metrics_listener.listen(METRICS_BACKLOG)
    if args.client_ca and not os.path.isfile(args.client_ca):
        raise UsageError(f"--client-ca {args.client_ca}: no such file")
    if bool(args.cert) != bool(args.key):
        raise UsageError("--cert and --key go together: give both, or neither for development certificates")
    target = self_managed_tls(args)
    live = live_source(args)
    if args.claims_namespace and not live:
        raise UsageError("--claims-namespace shares holds through the API: it needs the live cluster view")
    if args.metrics_secure and not live:
        raise UsageError("--metrics-secure has the cluster check each reader's token: it needs the live cluster "
                         "view (on files or the demo cluster the metrics port is local, plain HTTP and open)")
    # Against a cluster the metrics port is HTTPS and every reader authenticated and authorized, unless told not.
    secure_metrics = live if args.metrics_secure is None else args.metrics_secure
    # In a pod, replicas share claims in their own namespace unless told otherwise ('' turns it off).
    claims_namespace = own_namespace() if args.claims_namespace is None and live and not args.kubeconfig \
        else args.claims_namespace
    if not args.claims_budget > 0:
        raise UsageError(f"--claims-budget {args.claims_budget} must be a positive number of seconds")
    if live:
        api_client_from(args.kubeconfig)  # a bad kubeconfig stops start-up here, in one line
    if live and config.gate_waits and not args.gate_key_secret:
        log.warning("gate_waits without --gate-key-secret: this process seals gated waits with a key of its own, so "
                    "pods it gates are not released by another replica or after a restart (the chart passes it)")
    if args.gate_key_secret:
        if not live:
            raise UsageError("--gate-key-secret reads the key through the API: it needs the live cluster view")
        namespace, _, name = args.gate_key_secret.partition("/")
        if not (namespace and name):
            raise UsageError(f"--gate-key-secret {args.gate_key_secret!r}: expected NAMESPACE/NAME")
        config = dataclasses.replace(config, seal_key=ensure_gate_key(api_client_from(args.kubeconfig), namespace,
                                                                       name))
    cluster = ([], []) if live else read_cluster(args)
    cert, key = serving_certs(args, target)
    def reload_settings() -> None:  # SIGHUP: workers forked from now on take the file as it is now
        nonlocal config
        config = dataclasses.replace(reread(args.config, config), seal_key=config.seal_key)

    options = ServeOptions(bind=args.bind, cert=cert, key=key, client_ca=args.client_ca,
                           max_body_bytes=config.max_body_bytes, multiprocess_dir=metrics_dir(),
                           on_reload=reload_settings)

    def build_app() -> Flask:  # runs in the worker, after the fork, so the watch threads start there; `config` as
        # the server process last read it
        metrics = Metrics.create(options.multiprocess_dir)
        decisions = None if args.no_topology_page else RecentDecisions()
        if live:
            feed = ApiFeed(config, api_client_from(args.kubeconfig), claims_namespace=claims_namespace,
                           claims_budget_seconds=args.claims_budget, on_alone=metrics.decided_alone.inc,
                           on_scale_up=metrics.scale_up, on_release=metrics.gated_release)
            feed.start()
            metrics.watch_feed(feed.age)
            index, readiness = feed.index, feed.readiness
        else:
            index, readiness = file_index(config, cluster)
            out_of_the_collectors_way()  # the live feed does so after each full list
            say_levels(index, log.warning)
        app = create_app(config, index, readiness, metrics, decisions)
        start_metrics_server(metrics_listener, metrics.registry, app,
                             None if decisions is None else page_app(index, decisions),
                             tls=certs.ReloadingContext(cert, key).current if secure_metrics else None,
                             access=cluster_access(api_client_from(args.kubeconfig), metrics.access_failed)
                             if secure_metrics else None)
        if target is not None:  # the worker keeps the certificate and the caBundle current while it serves
            certbootstrap.keep_current(api_client_from(args.kubeconfig), target, cert, key)
        return app

    server = WebhookServer(build_app, options)  # loads the certificate: a bad one stops us here
    source = (f"the cluster of {args.kubeconfig}" if args.kubeconfig else "this cluster (in-cluster config)") \
        if live else args.nodes or "the built-in demo cluster"
    scheme = "https" if secure_metrics else "http"
    page = "" if args.no_topology_page else f", the topology page on {scheme}://{args.metrics_bind}/topology"
    log.info("serving https://%s/mutate with %s; metrics on %s://%s/metrics%s%s%s", args.bind, source, scheme,
             args.metrics_bind, page, " (bearer tokens checked by the cluster)" if secure_metrics else "",
             "; client certificates required" if args.client_ca else "")
    server.run()
    return 0


# ----- mutate -------------------------------------------------------------------------------------

def describe(obj: dict, namespace: str) -> str:
    """`Job ml/train`, or `Pod ml/trainer-` for a generateName object."""
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')} {namespace}/{meta.get('name') or meta.get('generateName') or '?'}"


def explain(label: str, result: admission.AdmissionResult) -> list[str]:
    decision = result.decision
    where = f" in {decision.scope}" if decision is not None and decision.scope is not None else ""
    lines = [f"{label}: {result.outcome}{where}"]
    if decision is not None:
        lines.extend(f"  - {reason}" for reason in decision.reasons)
    return lines


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def manifest_paths(paths: Sequence[str]) -> list[str]:
    """As kubectl -f takes them: a directory stands for its .yaml/.yml/.json files (not its
    subdirectories), in name order; `-` is stdin."""
    out = []
    for path in paths:
        if path != "-" and os.path.isdir(path):
            found = sorted(os.path.join(path, name) for name in os.listdir(path)
                           if name.endswith(MANIFEST_SUFFIXES) and os.path.isfile(os.path.join(path, name)))
            if not found:
                raise UsageError(f"-f {path}: the directory holds no .yaml, .yml or .json files")
            out.extend(found)
        else:
            out.append(path)
    return out


def cmd_mutate(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    cluster = read_cluster(args)
    # every input read and checked before anything is built or said: bad input is one line, exit 2
    objects = [obj for path in manifest_paths(args.filename)
               for obj in within_api_limits(path, read_objects(path, max_bytes=MANIFEST_FILE_MAX_BYTES))]
    if not objects:
        raise UsageError(f"no objects passed to mutate: {', '.join(args.filename)} hold(s) no Kubernetes object")
    index, _ = file_index(config, cluster)
    say_levels(index, lambda warning: print(f"Warning: {warning}", file=sys.stderr), logging.DEBUG)
    mutated, patches, denied = [], [], 0
    decisions = RecentDecisions()
    for position, obj in enumerate(objects):
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        label = describe(obj, namespace)
        # A CREATE as the apiserver sends it; not dryRun, so later objects see this one's reservation.
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{PROG}/mutate/{position}/{label}"))
        result = admission.review(admission.make_review(obj, namespace=namespace, uid=uid), index, config)
        decisions.record(result, time.time())
        response = result.review["response"]
        for warning in result.warnings:
            print(f"Warning: {warning}", file=sys.stderr)  # as kubectl prints them; they name the object
        if not response["allowed"]:
            denied += 1
            message = (response.get("status") or {}).get("message") or "no reason given"
            # The webhook's messages name the object already; name it here only when one does not.
            # With --explain this line is the object's headline (no second "denied" line), its
            # decision's reasons, if it had one, below it.
            print(f"Error: {label} denied: {message.removeprefix(label + ': ')}", file=sys.stderr)
            for reason in explain(label, result)[1:] if args.explain else []:
                print(reason, file=sys.stderr)
            continue
        if args.explain:
            print("\n".join(explain(label, result)), file=sys.stderr)
        patches.append(list(result.patch))
        mutated.append(result.admitted)
        if obj.get("kind") in DRA_KINDS:  # a workload's ResourceClaimTemplate or PodGroup, ahead of it
            index.upsert(in_namespace(result.admitted or obj, namespace))
    if args.output == "patch":  # one line per admitted object, each what `kubectl patch --type=json -p` takes
        for patch in patches:
            print(json.dumps(patch, separators=(",", ":")))
    elif args.output == "json":
        single = mutated[0] if len(mutated) == 1 else {"apiVersion": "v1", "kind": "List", "items": mutated}
        print(json.dumps(single, indent=2))
    elif mutated:  # streamed: a reader that closes stdout early shows as BrokenPipeError (see main)
        yaml.safe_dump_all(mutated, sys.stdout, sort_keys=False, explicit_start=len(mutated) > 1)
    if args.html:
        try:
            write_page(args.html, index, decisions, time.time())
        except OSError as err:
            raise UsageError(f"--html {args.html}: cannot write it ({err.strerror})") from None
    return 1 if denied else 0


# ----- certs --------------------------------------------------------------------------------------

def cmd_certs(args: argparse.Namespace) -> int:
    for flag, value in (("--service", args.service), ("--namespace", args.namespace)):
        if not _DNS_LABEL.fullmatch(value):
            raise UsageError(f"{flag} {value!r} is not a DNS label (lowercase letters, digits and '-', "
                             f"at most 63 characters)")
    existing = os.path.join(args.out, certs.CA_FILE)
    if os.path.exists(existing) and not args.force:
        raise UsageError(f"{existing} exists: a new CA would break every caBundle made from it; "
                         "give --force to replace it")
    paths = certs.write_certs(args.out, args.service, args.namespace)
    print(f"{PROG}: wrote {paths.ca}, {paths.cert}, {paths.key}; caBundle follows", file=sys.stderr)
    print(certs.ca_bundle(paths.ca))
    return 0


# ----- the parser ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Place GPU workloads by network and NVLink topology.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = subparsers.add_parser(
        "serve", help="run the admission webhook over TLS under gunicorn",
        description="Run the webhook over TLS. The cluster view comes from the API (--kubeconfig, or the "
                    "in-cluster config inside a pod), from files (--nodes/--pods), or, outside a cluster with "
                    "neither, from a built-in demo cluster (2 spines x 4 leaves x 4 nodes x 8 H100). Without --cert/--key, development certificates are "
                    "generated in ./certs/.")
    serve.add_argument("--nodes", metavar="FILE", help="Node objects (kubectl get nodes -o yaml)")
    serve.add_argument("--pods", metavar="FILE", help="Pod objects (kubectl get pods -A -o yaml)")
    serve.add_argument("--kubeconfig", metavar="FILE",
                       help="watch Nodes and Pods of this cluster (inside a pod, without --nodes, the in-cluster "
                            "config is used)")
    serve.add_argument("--config", metavar="FILE", help="settings file (YAML)")
    serve.add_argument("--bind", metavar="HOST:PORT", default=f"0.0.0.0:{DEFAULT_PORT}",
                       help="listen address (default: %(default)s)")
    serve.add_argument("--cert", metavar="FILE", help="serving certificate (PEM); reloaded when the file changes")
    serve.add_argument("--key", metavar="FILE", help="its private key (PEM)")
    serve.add_argument("--tls-secret", metavar="NAMESPACE/NAME",
                       help="keep a CA and the serving certificate in this Secret (created when missing, the "
                            "certificate issued again when it expires within 30 days or names other hosts), write "
                            "the certificate to --cert/--key and put the CA into --webhook-configuration's "
                            "caBundle, before serving (the chart's tls.mode selfManaged)")
    serve.add_argument("--tls-service", metavar="NAME",
                       help="with --tls-secret: the Service, in the Secret's namespace, the certificate names")
    serve.add_argument("--webhook-configuration", metavar="NAME",
                       help="with --tls-secret: the MutatingWebhookConfiguration whose every webhook gets the CA")
    serve.add_argument("--cluster-domain", metavar="DOMAIN", default="cluster.local",
                       help="with --tls-secret: the cluster's DNS domain, for the Service's full name "
                            "(default: %(default)s)")
    serve.add_argument("--workers", metavar="N", type=int, default=1,
                       help=f"worker processes: only 1 is allowed, with {THREADS_PER_WORKER} threads (its cluster "
                            "view and reservations are in that process; a second would book the same GPUs again)")
    serve.add_argument("--metrics-bind", metavar="HOST:PORT", default=DEFAULT_METRICS_BIND,
                       help="listen address of /metrics and the topology page (default: %(default)s)")
    serve.add_argument("--metrics-secure", action=argparse.BooleanOptionalAction, default=None,
                       help="serve the metrics port over HTTPS (the serving certificate) and answer only bearer "
                            "tokens the cluster authenticates and authorizes: get on /metrics; the topology page "
                            "shows a reader the workloads of the namespaces where they may list pods, or all "
                            "with get on /topology (/healthz and /readyz stay open). Default: on when watching "
                            "a cluster; --no-metrics-secure: plain HTTP, open to whoever reaches the port")
    serve.add_argument("--no-topology-page", action="store_true",
                       help="do not serve /topology and /topology.json on the metrics port (they name "
                            "namespaces, workloads and nodes: to each reader those they may see with "
                            "--metrics-secure, to whoever reaches the port without)")
    serve.add_argument("--client-ca", metavar="FILE",
                       help="require client certificates signed by this CA (mutual TLS with the apiserver)")
    serve.add_argument("--gate-key-secret", metavar="NAMESPACE/NAME",
                       help="the Secret holding the key that seals what a gated wait is released from, shared by "
                            "every replica (made with a random key if it does not exist); without it, a key of "
                            "this process")
    serve.add_argument("--claims-namespace", metavar="NS",
                       help="share pending holds with the other replicas through a Lease in NS, so two replicas "
                            "never place on the same free GPUs; live view only (default: inside a pod, its own "
                            "namespace; otherwise none; '' for none)")
    serve.add_argument("--claims-budget", metavar="SECONDS", type=float, default=DEFAULT_BUDGET_SECONDS,
                       help="how long an admission may spend agreeing with the other replicas before it decides "
                            "alone, with a warning (default: %(default)s)")
    serve.set_defaults(func=cmd_serve)

    mutate = subparsers.add_parser(
        "mutate", help="dry-run the webhook on manifest files (for CI)",
        description="Place and mutate the workloads in the files, in order (each sees the reservations of the "
                    "ones before). Exit 0 when all are admitted, 1 when any is denied, 2 on bad input. Refused as "
                    f"bad input: a --nodes/--pods file over {CLUSTER_FILE_MAX_BYTES // MiB} MiB, a -f file over "
                    f"{MANIFEST_FILE_MAX_BYTES // MiB} MiB, an object over the apiserver's {OBJECT_MAX_BYTES // MiB} "
                    f"MiB, what else the apiserver would refuse for its size (a ResourceSlice of over "
                    f"{RESOURCE_SLICE_MAX_DEVICES} devices), "
                    "and YAML whose aliases expand without end.")
    mutate.add_argument("-f", "--filename", metavar="FILE", action="append", required=True,
                        help="YAML or JSON manifests, a directory of them, '-' for stdin; repeatable")
    mutate.add_argument("--nodes", metavar="FILE", required=True,
                        help="Node objects, and Karpenter NodePools or cluster-autoscaler's status ConfigMap to "
                             "know how the cluster can grow (kubectl get nodes,nodepools -o yaml)")
    mutate.add_argument("--pods", metavar="FILE", help="Pod objects (kubectl get pods -A -o yaml)")
    mutate.add_argument("--config", metavar="FILE", help="settings file (YAML)")
    mutate.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml",
                        help="mutated objects as YAML or JSON, or per admitted object one line holding its JSON "
                             "Patch, as `kubectl patch --type=json -p` takes it (default: yaml)")
    mutate.add_argument("--explain", action="store_true", help="print each decision and its reasons on stderr")
    mutate.add_argument("--html", metavar="FILE",
                        help="also write the topology page (the cluster with these objects placed and held, and "
                             "their decisions) to FILE, one self-contained HTML file")
    mutate.set_defaults(func=cmd_mutate)

    certs_cmd = subparsers.add_parser(
        "certs", help="create a CA and a serving certificate for the webhook Service",
        description="Write ca.crt, tls.crt and tls.key to DIR for Service NAME in namespace NS and print the "
                    "base64 caBundle for the webhook configuration. The certificate's SANs cover NAME, NAME.NS, "
                    "NAME.NS.svc, NAME.NS.svc.cluster.local, localhost and 127.0.0.1. An existing DIR/ca.crt is "
                    "kept (exit 2) unless --force: a new CA breaks every caBundle made from the old one.")
    certs_cmd.add_argument("--service", metavar="NAME", required=True,
                           help="the webhook's Service, a DNS label")
    certs_cmd.add_argument("--namespace", metavar="NS", required=True, help="the Service's namespace")
    certs_cmd.add_argument("--out", metavar="DIR", required=True, help="where the three files go (made if missing)")
    certs_cmd.add_argument("--force", action="store_true", help="replace a CA already in DIR")
    certs_cmd.set_defaults(func=cmd_certs)
    discover_command.register(subparsers)
    ungate.register(subparsers)
    parser.add_argument("--log-level", choices=logs.LEVELS, default="info",
                        help="least severe level logged (default: %(default)s)")
    parser.add_argument("--log-format", choices=logs.FORMATS,
                        help="log lines as JSON objects or text (default: json for serve, text otherwise)")
    for command in subparsers.choices.values():  # also after the command; there they override
        command.add_argument("--log-level", choices=logs.LEVELS, default=argparse.SUPPRESS,
                             help="least severe level logged (default: info)")
        command.add_argument("--log-format", choices=logs.FORMATS, default=argparse.SUPPRESS,
                             help="log lines as JSON objects or text (default: json for serve, text otherwise)")
    return parser


# The exit status when whoever reads stdout closed it early (`mutate ... | head`): 128 + SIGPIPE (13),
# what a shell reports for a command SIGPIPE ended, as it ends `cat` or `yes`. Never 1: for mutate
# that means "denied".
EXIT_STDOUT_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # so a reader gone shows here, not as an error in the interpreter's exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a pipe or socket of something else: a bug to see, not a reader that had enough
        # Python's recipe (the signal module's "Note on SIGPIPE"): whatever is still buffered for
        # stdout goes to /dev/null, so the flush at exit does not fail again; no traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_STDOUT_CLOSED


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (replaced in tests), no poll
        return False


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    log_format = args.log_format or ("json" if args.func is cmd_serve else "text")
    logs.configure(log_format, args.log_level)
    try:
        return args.func(args)
    except (UsageError, ConfigError, ManifestError, certs.CertError) as err:
        if log_format == "json":
            log.error("%s: error: %s", PROG, err)
        else:
            print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
