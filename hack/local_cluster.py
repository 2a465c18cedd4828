"""A real control plane on this machine, for the end-to-end tests and the walk-through.

`up` builds (once, cached) the multi-call binary of hack/kube/ from Kubernetes' published Go
modules, then starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager, each its own
process on 127.0.0.1 with its own state folder under the state directory; creates the demo topology's
32 GPU nodes through the API (or, with --dra, DRA nodes: a DeviceClass and one ResourceSlice per
node); creates the chart's objects, rendered by Helm's engine as the tests render them, in the
apiserver for real; and starts the webhook as local processes that run with the chart's
ServiceAccount token, so the chart's RBAC is what they run with. The MutatingWebhookConfiguration
points at them by URL with its caBundle (with --replicas above 1, through a round-robin TCP relay:
the stand-in for the Service). It exits 0 once a server-side dry run comes back mutated by the
webhook, and prints `export KUBECONFIG=<path>` as its last line. `down` stops everything it
started, by PID, and removes the state; `status` says what runs. Bad flags or a failed start: one
line on stderr, exit 2, nothing left running.

There are no kubelets: pods are bound by kube-scheduler and stay Pending-bound; a test that needs a
pod to finish patches its status, as a kubelet would.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import yaml  # noqa: E402 - after the checkout is importable

DEFAULT_STATE = os.path.join(ROOT, ".local-cluster")
NAMESPACE = "topology-system"
RELEASE = "topology-webhook"
# TopologyAwareWorkloadScheduling (alpha in 1.37) lets a PodGroup keep the topology key the webhook
# writes: without it the apiserver drops spec.schedulingConstraints at create.
FEATURE_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
START_SECONDS = 180  # the apiserver's first start (storage bootstrap) is the slow one
# Components in the order they start; `down` stops them in reverse.
ORDER = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "webhook-0", "webhook-1",
         "webhook-2", "webhook-3", "relay")


class Failed(Exception):
    """A start that cannot go on: one line for the user."""


# ----- state --------------------------------------------------------------------------------------

class State:
    """The state directory: what runs (pids.json) and everything each component keeps."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)

    def file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def pids(self) -> dict[str, int]:
        try:
            with open(self.file("pids.json"), encoding="utf-8") as handle:
                return {str(k): int(v) for k, v in json.load(handle).items()}
        except (OSError, ValueError):
            return {}

    def remember(self, name: str, pid: int) -> None:
        pids = self.pids()
        pids[name] = pid
        _write(self.file("pids.json"), json.dumps(pids, indent=1))

    def commands(self) -> dict[str, dict]:
        """How each component was started (argv, env), for `restart`."""
        try:
            with open(self.file("commands.json"), encoding="utf-8") as handle:
                return dict(json.load(handle))
        except (OSError, ValueError):
            return {}

    def info(self) -> dict:
        try:
            with open(self.file("cluster.json"), encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {}


def _write(path: str, text: str | bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def alive(pid: int) -> bool:
    """Whether the process runs; a zombie (ours, or one init has yet to reap) has stopped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        if os.waitpid(pid, os.WNOHANG)[0] != 0:
            return False
    except ChildProcessError:
        pass  # not our child: started by an earlier `up`
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def stop_all(state: State) -> list[str]:
    """Stop every process the state names, newest first: SIGTERM, then SIGKILL after 10 s."""
    pids = state.pids()
    names = sorted(pids, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER), reverse=True)
    stopped = []
    for name in names:
        pid = pids[name]
        if not alive(pid):
            continue
        try:
            os.killpg(pid, signal.SIGTERM)  # each component leads its own process group
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stopped.append(name)
    return stopped


# ----- the binary, ports, certificates ----------------------------------------------------------

def build_binary() -> str:
    """The multi-call binary, built once per go.sum and sources (hack/kube/build.sh caches it)."""
    if shutil.which("go") is None and not os.path.exists("/usr/local/go/bin/go"):
        raise Failed("no Go toolchain on PATH: the control plane is built from Kubernetes' Go modules (Go 1.26+)")
    result = subprocess.run(["bash", os.path.join(ROOT, "hack", "kube", "build.sh")], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Failed(f"building the control plane failed: {tail}")
    return result.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_pki(state: State) -> None:
    """A CA for the apiserver and the webhook, and the service-account signing pair."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from webhook.serving import certs
    ca_cert, ca_key = certs.make_ca("local-cluster-ca")
    _write(state.file("pki", "ca.crt"), ca_cert)
    _write(state.file("pki", "ca.key"), ca_key, 0o600)
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    for name, dns in (("apiserver", names), ("webhook", ["localhost"])):
        cert, key = certs.make_serving_cert(ca_cert, ca_key, dns, ["127.0.0.1"])
        _write(state.file("pki", f"{name}.crt"), cert)
        _write(state.file("pki", f"{name}.key"), key, 0o600)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(state.file("pki", "sa.key"), sa.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                                          serialization.NoEncryption()), 0o600)
    _write(state.file("pki", "sa.pub"), sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def kubeconfig(state: State, server: str, user: str, token: str) -> str:
    path = state.file(f"{user}.kubeconfig")
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "local",
              "clusters": [{"name": "local", "cluster": {"server": server,
                                                          "certificate-authority": state.file("pki", "ca.crt")}}],
              "users": [{"name": user, "user": {"token": token}}],
              "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}]}
    _write(path, yaml.safe_dump(config), 0o600)
    return path


# ----- processes ------------------------------------------------------------------------------------

def start(state: State, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(state.file("logs", f"{name}.log"), "ab")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, env={**os.environ, **(env or {})}, cwd=state.path)
    state.remember(name, process.pid)
    commands = state.commands()
    commands[name] = {"argv": argv, "env": env or {}}
    _write(state.file("commands.json"), json.dumps(commands, indent=1))
    return process


def stop(state: State, name: str) -> None:
    """Stop one component (SIGTERM, then SIGKILL after 10 s); `restart` starts it again."""
    if name not in state.commands():
        raise Failed(f"no component {name!r} in {state.path}; there are: {', '.join(sorted(state.commands()))}")
    pid = state.pids().get(name)
    if pid is not None and alive(pid):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


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


def wait_for(what: str, check: Callable[[], bool], process: subprocess.Popen | None, state: State,
             name: str, seconds: float = START_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise Failed(f"{name} exited with status {process.returncode} before {what}; "
                         f"see {state.file('logs', name + '.log')}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError, ValueError):
            pass
        time.sleep(0.2)
    raise Failed(f"{name}: no {what} within {seconds:.0f} s; see {state.file('logs', name + '.log')}")


def https_ok(url: str, ca: str | None, token: str | None = None) -> bool:
    context = ssl.create_default_context(cafile=ca) if ca else ssl._create_unverified_context()  # noqa: S323
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=3, context=context) as answer:  # noqa: S310 - loopback only
        return answer.status == 200


def tcp_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def kubectl(binary: str, config: str, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run([binary, "kubectl", "--kubeconfig", config, *args], input=stdin, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise Failed(f"kubectl {' '.join(args[:3])}: {(result.stderr.strip().splitlines() or ['failed'])[-1]}")
    return result.stdout


# ----- what the cluster holds -----------------------------------------------------------------------

def demo_nodes(dra: bool) -> list[dict]:
    """tests/fixtures/demo-nodes.yaml's 32 nodes; under DRA without GPUs in allocatable."""
    with open(os.path.join(ROOT, "tests", "fixtures", "demo-nodes.yaml"), encoding="utf-8") as handle:
        nodes = yaml.safe_load(handle)["items"]
    for node in nodes:
        if dra:
            for field in ("allocatable", "capacity"):
                node["status"][field].pop("nvidia.com/gpu", None)
    return nodes


def dra_objects(nodes: list[dict]) -> list[dict]:
    """The DeviceClass of whole GPUs and one ResourceSlice per node, with the attributes NVIDIA's
    DRA driver publishes for an H100 (dra-driver-nvidia-gpu)."""
    from webhook.kube.demo import gpu_device_class, make_resource_slice
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


def chart_objects(replicas: int, api_versions: list[str]) -> list[dict]:
    """The chart's objects, rendered by Helm's engine (helm-python-sdk, as the tests render them)
    with the cluster's API versions, as `helm install` renders them there (the webhook rules for
    ResourceClaimTemplates and PodGroups depend on them), less what runs in a cluster
    (Deployment, Service, ...): the webhook runs here, and hooks are Helm's to run."""
    import helm_python
    from helm_python import _native  # Chart.render does not pass Helm's --api-versions on; this does
    values = {"replicas": replicas}
    chart = helm_python.Chart.load(os.path.join(ROOT, "charts", "topology-webhook"))
    rendered = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(
        {"name": RELEASE, "namespace": NAMESPACE, "api_versions": api_versions})))
    keep = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Secret",
            "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    out = []
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml"):
            continue
        for obj in yaml.safe_load_all(text):
            hook = ((obj or {}).get("metadata") or {}).get("annotations", {}).get("helm.sh/hook")
            if obj and obj.get("kind") in keep and not hook:
                out.append(obj)
    return out


def pointed_here(configuration: dict, port: int, ca_pem: bytes) -> dict:
    """The MutatingWebhookConfiguration calling the webhook on this machine, by URL."""
    out = copy.deepcopy(configuration)
    for entry in out["webhooks"]:
        path = ((entry.get("clientConfig") or {}).get("service") or {}).get("path") or "/mutate"
        entry["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                 "caBundle": base64.b64encode(ca_pem).decode()}
    return out


def create_objects(binary: str, admin: str, objects: list[dict]) -> None:
    if objects:
        kubectl(binary, admin, "apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=yaml.safe_dump_all(objects))


# ----- the relay (the Service's stand-in) ------------------------------------------------------------

def relay(listen: int, backends: list[int]) -> None:
    """Round-robin TCP: each connection goes to the next webhook replica that accepts it."""
    turn = 0

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        nonlocal turn
        for _ in range(len(backends)):
            port = backends[turn % len(backends)]
            turn += 1
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))
            return
        client_writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


# ----- up, down, status ---------------------------------------------------------------------------

def up(args: argparse.Namespace, state: State) -> str:
    if state.pids() and any(alive(pid) for pid in state.pids().values()):
        raise Failed(f"a local cluster already runs from {state.path}: `hack/local-cluster down` first")
    shutil.rmtree(state.path, ignore_errors=True)
    os.makedirs(state.file("logs"))
    binary = build_binary()
    make_pki(state)
    ca = state.file("pki", "ca.crt")
    tokens = {user: base64.b32encode(os.urandom(20)).decode().lower() for user in ("admin", "scheduler", "manager")}
    # Only the webhook runs under real RBAC (its ServiceAccount's); the control plane's own
    # components are masters here, as no certificates bind them to their bootstrap roles.
    _write(state.file("tokens.csv"), "".join(
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
    _write(scheduler_config, yaml.safe_dump({
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

    if not args.bare:
        nodes = demo_nodes(args.dra)
        create_nodes(binary, admin, nodes)
        if args.dra:
            create_objects(binary, admin, dra_objects(nodes))
        install_webhook(args, state, binary, admin, server, tokens)
    _write(state.file("cluster.json"), json.dumps({"server": server, "kubeconfig": admin, "dra": args.dra,
                                                    "replicas": 0 if args.bare else args.replicas, "binary": binary,
                                                    "namespace": NAMESPACE}, indent=1))
    return admin


def create_nodes(binary: str, admin: str, nodes: list[dict]) -> None:
    """Nodes with their status: the apiserver keeps a Node's status on create (no kubelet will)."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    api = k8s_client.CoreV1Api(k8s_config.new_client_from_config(admin))
    for node in nodes:
        api.create_node(node)
        stored = api.read_node(node["metadata"]["name"])
        if not (stored.status and stored.status.allocatable):
            api.patch_node_status(node["metadata"]["name"], {"status": node["status"]})


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
    _write(settings, config_map["data"]["config.yaml"])
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
            "--metrics-bind", f"127.0.0.1:{metrics}", "--claims-namespace", NAMESPACE, *key_args],
            env={"PYTHONPATH": ROOT})
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_relay"]:
        relay(int(argv[1]), [int(p) for p in argv[2:]])
        return 0
    parser = OneLineParser(prog="hack/local-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", default=os.environ.get("LOCAL_CLUSTER_DIR", DEFAULT_STATE),
                        help="state directory (default: .local-cluster in the checkout, or $LOCAL_CLUSTER_DIR)")
    commands = parser.add_subparsers(dest="command", required=True)
    start_up = commands.add_parser("up", help="build if needed, start everything, register the webhook")
    start_up.add_argument("--dra", action="store_true", help="DRA nodes: GPUs as ResourceSlice devices")
    start_up.add_argument("--replicas", type=int, default=2, help="webhook processes sharing claims (1-4; default 2)")
    start_up.add_argument("--bare", action="store_true",
                          help="the control plane alone: no nodes, no webhook (a bench brings its own)")
    start_up.add_argument("--controller-qps", type=int, default=0, metavar="Q",
                          help="kube-controller-manager's requests per second to the apiserver, burst 1.5 Q "
                               "(default: its own, 20 and burst 30); large clusters raise it")
    commands.add_parser("down", help="stop everything up started and remove its state")
    for verb, text in (("stop", "stop one component (e.g. webhook-0)"),
                       ("restart", "stop one component and start it again, as up started it")):
        commands.add_parser(verb, help=text).add_argument("component")
    commands.add_parser("status", help="say what runs")
    try:
        args = parser.parse_args(argv)
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
    if not 1 <= args.replicas <= 4:
        print("hack/local-cluster: --replicas must be 1 to 4", file=sys.stderr)
        return 2
    if args.controller_qps < 0:
        print("hack/local-cluster: --controller-qps must be 0 (the controller-manager's own) or more", file=sys.stderr)
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
    webhooks = "no nodes and no webhook (--bare)" if args.bare else f"{args.replicas} webhook replica(s)"
    print(f"local cluster up in {time.monotonic() - begun:.0f} s: etcd, kube-apiserver, kube-scheduler, "
          f"kube-controller-manager, {webhooks}; state in {state.path}", file=sys.stderr)
    print(f"export KUBECONFIG={admin}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
