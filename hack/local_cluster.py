"""A real control plane on this machine, for the end-to-end tests and the walk-through.

`up` builds (once, cached) the multi-call binary of hack/kube/ from Kubernetes' published Go
modules, then starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager, each its own
process on 127.0.0.1 with its own state folder under the state directory; creates GPU nodes through
the API: the demo topology's 32, or --nodes N in its shape (hack/cluster_nodes.py; with --dra, DRA
nodes: a DeviceClass and one ResourceSlice per node); creates the chart's objects, rendered by
Helm's engine as the tests render them, in the apiserver for real; and starts the webhook as local
processes that run with the chart's ServiceAccount token, so the chart's RBAC is what they run
with. The MutatingWebhookConfiguration points at them by URL with its caBundle (with --replicas
above 1, through a round-robin TCP relay: the stand-in for the Service). It exits 0 once a
server-side dry run comes back mutated by the webhook, and prints `export KUBECONFIG=<path>` as its
last line. `down` stops everything it started, by PID, and removes the state; `status` says what
runs. Bad flags or a failed start: one line on stderr, exit 2, nothing left running.

Without --kwok there are no kubelets: pods are bound by kube-scheduler and stay Pending-bound; a
test that needs a pod to finish patches its status, as a kubelet would. With --kwok, KWOK plays
every node's kubelet (hack/kwok.py): Ready nodes with Leases, pods that go Running and Jobs' pods
that finish. --kueue installs Kueue beside it (hack/kueue.py).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import yaml  # noqa: E402 - after the checkout is importable

from hack import cluster_nodes, kueue  # noqa: E402
from hack.kwok import start_kwok  # noqa: E402
from hack.processes import (ORDER, Failed, State, alive, create_objects, free_port, https_ok,  # noqa: E402
                            kubeconfig, kubectl, make_pki, pointed_here, relay, start, stop, stop_all, tcp_open,
                            wait_for, write)

DEFAULT_STATE = os.path.join(ROOT, ".local-cluster")
NAMESPACE = "topology-system"
RELEASE = "topology-webhook"
# TopologyAwareWorkloadScheduling (alpha in 1.37) lets a PodGroup keep the topology key the webhook
# writes: without it the apiserver drops spec.schedulingConstraints at create.
FEATURE_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"


# ----- the binaries ----------------------------------------------------------------------------------

def build(what: str, script: str, *args: str) -> str:
    """A Go program, built once per version and cached by its script (hack/kube/build.sh for the
    control plane's, hack/go-install.sh for KWOK's and Kueue's); its path."""
    result = subprocess.run(["bash", os.path.join(ROOT, "hack", script), *args], capture_output=True, text=True)
    if result.returncode != 0 and shutil.which("go") is None and not os.path.exists("/usr/local/go/bin/go"):
        # a build cached already needs no Go: only one to be made does
        raise Failed(f"no Go toolchain on PATH: {what} is built from its published Go modules (Go 1.26+)")
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Failed(f"building {what} failed: {tail}")
    return result.stdout.strip().splitlines()[-1]


# ----- processes ------------------------------------------------------------------------------------

def restart(state: State, name: str) -> None:
    """Stop one component and start it again as `up` started it (a webhook restarted while pods
    are gated, say), waiting until it is ready again."""
    stop(state, name)
    commands = state.commands()
    process = start(state, name, commands[name]["argv"], commands[name]["env"])
    if name.startswith("webhook-"):
        argv = commands[name]["argv"]
        port = argv[argv.index("--bind") + 1].rpartition(":")[2]
        wait_for("ready webhook", lambda: https_ok(f"https://127.0.0.1:{port}/readyz", state.file("pki", "ca.crt")),
                 process, state, name)


# ----- what the cluster holds -----------------------------------------------------------------------

def served_api_versions(server: str, ca: str, token: str) -> list[str]:
    """What Helm's `.Capabilities.APIVersions` holds when it installs into this cluster: every
    served group/version, and group/version/Kind of each of its resources."""
    context = ssl.create_default_context(cafile=ca)

    def get(path: str) -> dict:
        request = urllib.request.Request(f"{server}{path}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310 - loopback only
            return json.load(answer)
    paths = ["/api/v1"] + [f"/apis/{version['groupVersion']}" for group in get("/apis")["groups"]
                           for version in group["versions"]]
    out = []
    for path in paths:
        listing = get(path)
        out.append(listing["groupVersion"])
        out += [f"{listing['groupVersion']}/{r['kind']}" for r in listing["resources"] if "/" not in r["name"]]
    return out


def rendered_chart(replicas: int, api_versions: list[str]) -> list[dict]:
    """Every object of the chart, hooks included, rendered by Helm's engine (helm-python-sdk, as
    the tests render them) with the cluster's API versions, as `helm install` renders them there
    (the webhook rules for ResourceClaimTemplates and PodGroups depend on them)."""
    import helm_python
    from helm_python import _native  # Chart.render does not pass Helm's --api-versions on; this does
    values = {"replicas": replicas}
    chart = helm_python.Chart.load(os.path.join(ROOT, "charts", "topology-webhook"))
    rendered = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(
        {"name": RELEASE, "namespace": NAMESPACE, "api_versions": api_versions})))
    return [obj for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for obj in yaml.safe_load_all(text) if obj]


def hook_of(obj: dict) -> str | None:
    """When Helm runs `obj` (pre-delete, ...), if it is a hook."""
    return ((obj.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook")


def chart_objects(replicas: int, api_versions: list[str]) -> list[dict]:
    """The chart's objects as `helm install` creates them, less what runs in a cluster (Deployment,
    Service, ...): the webhook runs here, and hooks are Helm's to run."""
    keep = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Secret",
            "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    return [obj for obj in rendered_chart(replicas, api_versions) if obj.get("kind") in keep and not hook_of(obj)]


# ----- up, down, status ---------------------------------------------------------------------------

def up(args: argparse.Namespace, state: State) -> str:
    if state.pids() and any(alive(pid) for pid in state.pids().values()):
        raise Failed(f"a local cluster already runs from {state.path}: `hack/local-cluster down` first")
    shutil.rmtree(state.path, ignore_errors=True)
    os.makedirs(state.file("logs"))
    binary = build("the control plane", "kube/build.sh")
    kwok_binary = build("KWOK", "go-install.sh", "kwok") if args.kwok else ""
    kueue_binary = build("Kueue", "go-install.sh", "kueue") if args.kueue else ""
    make_pki(state)
    server, admin, tokens = start_control_plane(args, state, binary)
    if not args.bare:
        nodes = cluster_nodes.gpu_nodes(args.nodes, args.shape, dra=args.dra, ready=not args.kwok)
        if args.kwok:  # first: it initializes each node as it comes
            start_kwok(state, kwok_binary, admin, len(nodes))
        cluster_nodes.create_nodes(admin, nodes)
        if args.dra:
            create_objects(binary, admin, cluster_nodes.dra_objects(nodes))
        if args.kwok:
            cluster_nodes.wait_ready(admin, len(nodes), seconds=60 + len(nodes) / 25)
        if args.replicas:
            install_webhook(args, state, binary, admin, server, tokens)
        if args.kueue:
            kueue.install_kueue(state, kueue_binary, binary, admin, nodes, args.kueue_strict_fifo)
    write(state.file("cluster.json"), json.dumps({
        "server": server, "kubeconfig": admin, "dra": args.dra, "replicas": 0 if args.bare else args.replicas,
        "nodes": 0 if args.bare else args.nodes, "kwok": args.kwok, "kueue": args.kueue, "binary": binary,
        "namespace": NAMESPACE}, indent=1))
    return admin


def start_control_plane(args: argparse.Namespace, state: State, binary: str) -> tuple[str, str, dict[str, str]]:
    """etcd, kube-apiserver, kube-scheduler and kube-controller-manager, each healthy: the
    apiserver's URL, the admin's kubeconfig and each user's token."""
    ca = state.file("pki", "ca.crt")
    tokens = {user: base64.b32encode(os.urandom(20)).decode().lower() for user in ("admin", "scheduler", "manager")}
    # Only the webhook runs under real RBAC (its ServiceAccount's); the control plane's own
    # components are masters here, as no certificates bind them to their bootstrap roles.
    write(state.file("tokens.csv"), "".join(
        f'{tokens[user]},{name},{name},"system:masters"\n' for user, name in (
            ("admin", "local-admin"), ("scheduler", "system:kube-scheduler"),
            ("manager", "system:kube-controller-manager"))), 0o600)
    ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "scheduler", "manager")}
    server = f"https://127.0.0.1:{ports['apiserver']}"
    admin = kubeconfig(state, server, "admin", tokens["admin"])

    etcd = start(state, "etcd", [binary, "etcd", "--data-dir", state.file("etcd"),
                                 "--listen-client-url", f"http://127.0.0.1:{ports['etcd']}",
                                 "--listen-peer-url", f"http://127.0.0.1:{ports['etcd-peer']}"])
    wait_for("etcd serving", lambda: tcp_open(ports["etcd"]), etcd, state, "etcd")
    pki = state.file("pki")
    apiserver = start(state, "kube-apiserver", [
        binary, "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{ports['etcd']}", "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
        f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
        f"--client-ca-file={pki}/ca.crt", "--service-cluster-ip-range=10.0.0.0/24",
        "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={pki}/sa.pub",
        f"--service-account-signing-key-file={pki}/sa.key", f"--token-auth-file={state.file('tokens.csv')}",
        "--authorization-mode=RBAC", "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        "--endpoint-reconciler-type=none", "--allow-privileged=true", "--profiling=false",
        f"--feature-gates={FEATURE_GATES}", f"--runtime-config={RUNTIME_CONFIG}",
        f"--cert-dir={state.file('apiserver')}"])
    wait_for("ready apiserver", lambda: https_ok(f"{server}/readyz", ca, tokens["admin"]), apiserver, state,
             "kube-apiserver")

    scheduler_config = state.file("scheduler.yaml")
    write(scheduler_config, yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig(state, server, "scheduler", tokens["scheduler"])},
        "leaderElection": {"leaderElect": False}}))
    scheduler = start(state, "kube-scheduler", [
        binary, "kube-scheduler", f"--config={scheduler_config}", "--bind-address=127.0.0.1",
        f"--secure-port={ports['scheduler']}", f"--feature-gates={FEATURE_GATES}",
        f"--cert-dir={state.file('scheduler')}"])
    manager_config = kubeconfig(state, server, "manager", tokens["manager"])
    manager = start(state, "kube-controller-manager", [
        binary, "kube-controller-manager", f"--kubeconfig={manager_config}",
        f"--authentication-kubeconfig={manager_config}", f"--authorization-kubeconfig={manager_config}",
        "--controllers=*,-node-lifecycle-controller", "--leader-elect=false", "--bind-address=127.0.0.1",
        f"--secure-port={ports['manager']}", f"--service-account-private-key-file={pki}/sa.key",
        f"--root-ca-file={pki}/ca.crt", "--use-service-account-credentials=false",
        f"--feature-gates={FEATURE_GATES}", f"--cert-dir={state.file('controller-manager')}",
        *([f"--kube-api-qps={args.controller_qps}", f"--kube-api-burst={args.controller_qps * 3 // 2}"]
          if args.controller_qps else [])])
    wait_for("healthy scheduler", lambda: https_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", None),
             scheduler, state, "kube-scheduler")
    wait_for("healthy controller-manager", lambda: https_ok(f"https://127.0.0.1:{ports['manager']}/healthz", None),
             manager, state, "kube-controller-manager")

    return server, admin, tokens


def install_webhook(args: argparse.Namespace, state: State, binary: str, admin: str, server: str,
                    tokens: dict[str, str]) -> None:
    objects = chart_objects(args.replicas, served_api_versions(server, state.file("pki", "ca.crt"), tokens["admin"]))
    configuration = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in (o.get("data") or {}))
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    kubectl(binary, admin, "create", "namespace", NAMESPACE)
    create_objects(binary, admin, [o for o in objects if o["kind"] != "MutatingWebhookConfiguration"])
    token = kubectl(binary, admin, "create", "token", account, "-n", NAMESPACE, "--duration=48h").strip()
    webhook_config = kubeconfig(state, server, "webhook", token)
    settings = state.file("webhook", "config.yaml")
    write(settings, config_map["data"]["config.yaml"])
    key_args = ["--gate-key-secret", f"{NAMESPACE}/{RELEASE}-gate-key"] if any(
        o["kind"] == "ValidatingAdmissionPolicy" for o in objects) else []
    pki = state.file("pki")
    ports = []
    for replica in range(args.replicas):
        port, metrics = free_port(), free_port()
        name = f"webhook-{replica}"
        process = start(state, name, [
            sys.executable, "-m", "webhook", "serve", "--kubeconfig", webhook_config, "--config", settings,
            "--cert", f"{pki}/webhook.crt", "--key", f"{pki}/webhook.key", "--bind", f"127.0.0.1:{port}",
            "--metrics-bind", f"127.0.0.1:{metrics}", "--claims-namespace", NAMESPACE, *key_args,
            *(["--claims-allotments"] if args.allotments else [])],
            env={"PYTHONPATH": ROOT, "POD_NAME": name})  # its name on the topology page, as a pod's
        wait_for("ready webhook", lambda: https_ok(f"https://127.0.0.1:{port}/readyz", state.file("pki", "ca.crt")),
                 process, state, name)
        ports.append(port)
    port = ports[0]
    if len(ports) > 1:
        port = free_port()
        relayed = start(state, "relay", [sys.executable, os.path.abspath(__file__), "_relay", str(port),
                                         *map(str, ports)])
        wait_for("relay listening", lambda: tcp_open(port), relayed, state, "relay")
    with open(state.file("pki", "ca.crt"), "rb") as handle:
        create_objects(binary, admin, [pointed_here(configuration, port, handle.read())])
    wait_for("the webhook registered (a dry run mutated)", lambda: registered(binary, admin), None, state,
             "webhook-0", seconds=60)


PROBE = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
    "name": "local-cluster-probe", "namespace": "default",
    "annotations": {"topology.scheduler/gpu-count": "8"}},
    "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{
        "name": "probe", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}


def registered(binary: str, admin: str) -> bool:
    """A server-side dry run of an annotated Job comes back with our placement on it."""
    try:
        out = kubectl(binary, admin, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(PROBE))
    except Failed:
        return False
    annotations = json.loads(out)["spec"]["template"]["metadata"].get("annotations") or {}
    return "topology.scheduler/placement" in annotations


def status(state: State) -> int:
    pids = state.pids()
    if not pids:
        print(f"no local cluster in {state.path}")
        return 1
    running = 0
    for name in sorted(pids, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        up_now = alive(pids[name])
        running += up_now
        where = ""
        argv = state.commands().get(name, {}).get("argv") or []
        if name.startswith("webhook-") and "--metrics-bind" in argv:
            where = f"  https://{argv[argv.index('--metrics-bind') + 1]}/topology"
        print(f"{name:<24} pid {pids[name]:<8} {'running' if up_now else 'stopped'}{where}")
    kubeconfig_path = state.info().get("kubeconfig")
    if kubeconfig_path:
        # The metrics port checks each reader's token with the cluster: the admin's may read it all.
        token = yaml.safe_load(open(kubeconfig_path, encoding="utf-8"))["users"][0]["user"]["token"]
        print(f"the topology page and /metrics: curl --cacert {state.file('pki', 'ca.crt')} "
              f"-H 'Authorization: Bearer {token}' URL")
        print(f"export KUBECONFIG={kubeconfig_path}")
    return 0 if running == len(pids) else 1


class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one line on stderr, exit 2 (argparse prints the usage too)."""

    def error(self, message: str) -> Any:
        print(f"hack/local-cluster: {message} (see hack/local-cluster --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="hack/local-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", default=os.environ.get("LOCAL_CLUSTER_DIR", DEFAULT_STATE),
                        help="state directory (default: .local-cluster in the checkout, or $LOCAL_CLUSTER_DIR)")
    commands = parser.add_subparsers(dest="command", required=True)
    start_up = commands.add_parser("up", help="build if needed, start everything, register the webhook")
    start_up.add_argument("--dra", action="store_true", help="DRA nodes: GPUs as ResourceSlice devices")
    start_up.add_argument("--replicas", type=int, default=2,
                          help="webhook processes sharing claims (0-4; default 2; 0: the nodes without our webhook)")
    start_up.add_argument("--allotments", action="store_true",
                          help="the replicas claim a small domain's free GPUs ahead (serve --claims-allotments)")
    start_up.add_argument("--bare", action="store_true",
                          help="the control plane alone: no nodes, no webhook (a bench brings its own)")
    start_up.add_argument("--controller-qps", type=int, default=0, metavar="Q",
                          help="kube-controller-manager's requests per second to the apiserver, burst 1.5 Q "
                               "(default: its own, 20 and burst 30); large clusters raise it")
    start_up.add_argument("--nodes", type=int, default=cluster_nodes.DEMO_NODES, metavar="N",
                          help=f"GPU nodes of 8 GPUs each, 1 to {cluster_nodes.MAX_NODES:,} (default: the demo's "
                               f"{cluster_nodes.DEMO_NODES})")
    start_up.add_argument("--shape", default="/".join(map(str, cluster_nodes.DEMO_SHAPE)), metavar="S/L/N",
                          help="spines per zone, leaves per spine, nodes per leaf, filled in that order "
                               "(default: the demo's 2/4/4)")
    start_up.add_argument("--kwok", action="store_true",
                          help="KWOK plays every node's kubelet: Ready nodes with Leases, bound pods Running, "
                               "Jobs' pods Succeeded after their pod-complete.stage.kwok.x-k8s.io/delay")
    start_up.add_argument("--kueue", action="store_true",
                          help="Kueue too, with a Topology, ResourceFlavor, ClusterQueue and LocalQueue `gpus` in "
                               "default over the GPU nodes")
    start_up.add_argument("--kueue-strict-fifo", action="store_true",
                          help="the ClusterQueue's queueing strategy StrictFIFO (default: BestEffortFIFO)")
    commands.add_parser("down", help="stop everything up started and remove its state")
    for verb, text in (("stop", "stop one component (e.g. webhook-0)"),
                       ("restart", "stop one component and start it again, as up started it")):
        commands.add_parser(verb, help=text).add_argument("component")
    commands.add_parser("status", help="say what runs")
    return parser


def refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with `up`'s flags, if anything; `args.shape` parsed on the way."""
    try:
        args.shape = cluster_nodes.parse_shape(args.shape)
    except ValueError as err:
        return str(err)
    if not 0 <= args.replicas <= 4:
        return "--replicas must be 0 to 4"
    if args.controller_qps < 0:
        return "--controller-qps must be 0 (the controller-manager's own) or more"
    if not 1 <= args.nodes <= cluster_nodes.MAX_NODES:
        return f"--nodes must be 1 to {cluster_nodes.MAX_NODES}"
    if args.bare and (args.kwok or args.kueue):
        return "--bare starts no nodes: --kwok and --kueue need them"
    if args.kueue and args.dra:
        return "--kueue counts nvidia.com/gpu in the nodes' allocatable, which --dra nodes do not have"
    if args.kueue_strict_fifo and not args.kueue:
        return "--kueue-strict-fifo is a setting of --kueue's ClusterQueue"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_relay"]:
        relay(int(argv[1]), [int(p) for p in argv[2:]])
        return 0
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return 2 if exit_.code else 0
    state = State(args.state)
    if args.command == "status":
        return status(state)
    if args.command in ("stop", "restart"):
        try:
            (stop if args.command == "stop" else restart)(state, args.component)
        except Failed as err:
            print(f"hack/local-cluster: {err}", file=sys.stderr)
            return 2
        print(f"{args.command}ed {args.component}".replace("stoped", "stopped"))
        return 0
    if args.command == "down":
        stopped = stop_all(state)
        shutil.rmtree(state.path, ignore_errors=True)
        print(f"stopped {', '.join(stopped) if stopped else 'nothing (none ran)'}; removed {state.path}")
        return 0
    wrong = refusal(args)
    if wrong:
        print(f"hack/local-cluster: {wrong}", file=sys.stderr)
        return 2
    begun = time.monotonic()

    def interrupted(signum: int, _frame: Any) -> None:
        raise Failed(f"interrupted by signal {signum} before the cluster was up")
    signal.signal(signal.SIGTERM, interrupted)  # a caller's timeout: what was started is stopped
    try:
        admin = up(args, state)
    except BaseException as err:  # noqa: BLE001 - any failure, ^C too: one line, and nothing left running
        stop_all(state)
        print(f"hack/local-cluster: {err if isinstance(err, Failed) else f'{type(err).__name__}: {err}'}",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(f"local cluster up in {time.monotonic() - begun:.0f} s: {what_runs(args)}; state in {state.path}",
          file=sys.stderr)
    print(f"export KUBECONFIG={admin}")
    return 0


def what_runs(args: argparse.Namespace) -> str:
    parts = ["etcd, kube-apiserver, kube-scheduler, kube-controller-manager"]
    if args.bare:
        return parts[0] + ", no nodes and no webhook (--bare)"
    parts.append(f"{args.nodes} GPU nodes" + (" played by KWOK" if args.kwok else ""))
    parts.append(f"{args.replicas} webhook replica(s)")
    if args.kueue:
        parts.append("Kueue")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
