"""`topology-webhook serve`: the webhook over TLS under gunicorn, its cluster view from the API, files
or the demo cluster; the serving certificate (given, kept in a Secret, or for development), the
metrics port, and the settings reread on SIGHUP."""
from __future__ import annotations

import argparse
import atexit
import dataclasses
import os
import socket
from typing import TYPE_CHECKING, Any

from ..kube import certbootstrap
from ..kube.access import cluster_access
from ..kube.clusterview import own_namespace
from ..kube.gatekey import ensure_gate_key
from ..credentials.kubeclient import api_client_from
from ..kube.allotment import ALLOTMENT_SHARE
from ..kube.shared_claims import DEFAULT_BUDGET_SECONDS
from ..kube.shared_decisions import ApiDecisionRecords
from ..credentials import certs
from ..serving.app import create_app
from ..serving.metrics import MULTIPROC_ENV, Metrics, reset_multiprocess_dir
from ..serving.metrics_port import METRICS_BACKLOG, start_metrics_server
from ..serving.page.render import page_app
from ..admission.recent import RecentDecisions
from ..serving.paths import DEFAULT_PORT
from ..serving.server import THREADS_PER_WORKER, ServeOptions, WebhookServer
from ..settings.config import Config, ConfigError
from ..settings.loading import load_config
from ..state.index import out_of_the_collectors_way
from .inputs import file_index, read_cluster, say_levels
from .live import live_view
from .program import DNS_LABEL, UsageError, log

if TYPE_CHECKING:
    from flask import Flask

DEV_CERT_DIR = "certs"
DEFAULT_METRICS_BIND = "0.0.0.0:9090"


def register(subparsers: Any) -> None:
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
                       help="require client certificates signed by this CA on the webhook port (mutual TLS: the "
                            "apiserver presents one from its admission configuration's kubeconfig); a replaced "
                            "file is trusted from the next connection. Give the CA that signs only the "
                            "apiserver's certificate, not the cluster's client CA")
    serve.add_argument("--gate-key-secret", metavar="NAMESPACE/NAME",
                       help="the Secret holding the key that seals what a gated wait is released from, shared by "
                            "every replica (made with a random key if it does not exist); without it, a key of "
                            "this process")
    serve.add_argument("--claims-namespace", metavar="NS",
                       help="share pending holds with the other replicas through a Lease in NS, so two replicas "
                            "never place on the same free GPUs, and the topology page's recent decisions through "
                            "a Lease per replica; live view only (default: inside a pod, its own namespace; "
                            "otherwise none; '' for none)")
    serve.add_argument("--claims-budget", metavar="SECONDS", type=float, default=DEFAULT_BUDGET_SECONDS,
                       help="how long an admission may spend agreeing with the other replicas before it decides "
                            "alone, with a warning (default: %(default)s)")
    serve.add_argument("--claims-allotments", action="store_true",
                       help="claim the free GPUs of a small domain ahead, so that placements inside it are answered "
                            "before their Lease write (off by default: another replica's allotment can make a "
                            "workload wait, pinned to a full node; docs/design/ledger-and-claims.md)")
    serve.set_defaults(func=cmd_serve)


def replica_name() -> str:
    """What this replica is called on the topology page: its Pod's name (the chart passes POD_NAME
    from the downward API; the host name is the node's with hostNetwork), else host and process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def pod_owner(namespace: str) -> dict | None:
    """The ownerReference of this replica's Pod for objects it writes in `namespace` (the chart
    passes POD_NAME and POD_UID), so that they go with the Pod; None outside a Pod or its namespace."""
    name, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    if not (name and uid) or own_namespace() != namespace:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def live_source(args: argparse.Namespace) -> bool:
    """Whether serve watches the API: with --kubeconfig, or inside a pod when no --nodes is given."""
    if args.kubeconfig and (args.nodes or args.pods):
        raise UsageError("--kubeconfig watches the cluster; --nodes/--pods read files: give one or the other")
    return bool(args.kubeconfig) or (not args.nodes and bool(os.environ.get("KUBERNETES_SERVICE_HOST")))


def parse_bind(text: str, flag: str = "--bind", example_port: int = DEFAULT_PORT) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
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
    if not (DNS_LABEL.fullmatch(namespace) and name):
        raise UsageError(f"--tls-secret {args.tls_secret!r} is not NAMESPACE/NAME")
    if not (args.cert and args.key):
        raise UsageError("--tls-secret writes the serving certificate to --cert and --key: give both")
    if not (args.tls_service and DNS_LABEL.fullmatch(args.tls_service)):
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
        decisions = None if args.no_topology_page else RecentDecisions(replica=replica_name())
        if live:
            api_client = api_client_from(args.kubeconfig)
            # Replicas sharing claims share their recent decisions too, for every page to list them all.
            records = ApiDecisionRecords(decisions, api_client, claims_namespace, pod_owner(claims_namespace)) \
                if decisions is not None and claims_namespace else None
            feed = live_view(config, api_client, claims_namespace=claims_namespace,
                             claims_budget_seconds=args.claims_budget, on_alone=metrics.decided_alone.inc,
                             claims_allotment_share=ALLOTMENT_SHARE if args.claims_allotments else 0,
                             on_scale_up=metrics.scale_up, on_release=metrics.gated_release,
                             decision_records=records)
            feed.start()
            atexit.register(feed.stop)  # a graceful shutdown gives back the GPUs its allotment holds
            if records is not None:
                records.start()
                atexit.register(records.stop)  # and writes the decisions made since the last write
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
