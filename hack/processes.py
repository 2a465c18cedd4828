"""The local cluster's state folder and the processes it starts: each component its own process
group with its own log, remembered by PID (pids.json) and by how it was started (commands.json), so
that `down`, `stop` and `restart` find it again from another invocation; the certificates they
share, the objects they are registered with, and the relay in front of the webhook replicas."""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Callable

import yaml

START_SECONDS = 180  # the apiserver's first start (storage bootstrap) is the slow one
# Components in the order they start; `down` stops them in reverse.
ORDER = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "webhook-0", "webhook-1",
         "webhook-2", "webhook-3", "relay", "kueue")


class Failed(Exception):
    """A start that cannot go on: one line for the user."""


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
        write(self.file("pids.json"), json.dumps(pids, indent=1))

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


def write(path: str, text: str | bytes, mode: int = 0o644) -> None:
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
    """Stop every process the state names, newest first."""
    pids = state.pids()
    names = sorted(pids, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER), reverse=True)
    return [name for name in names if end(pids[name])]


def end(pid: int) -> bool:
    """SIGTERM to the process group the component leads, then SIGKILL after 10 s; whether it ran."""
    if not alive(pid):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kubeconfig(state: State, server: str, user: str, token: str) -> str:
    path = state.file(f"{user}.kubeconfig")
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "local",
              "clusters": [{"name": "local", "cluster": {"server": server,
                                                          "certificate-authority": state.file("pki", "ca.crt")}}],
              "users": [{"name": user, "user": {"token": token}}],
              "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}]}
    write(path, yaml.safe_dump(config), 0o600)
    return path


def start(state: State, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(state.file("logs", f"{name}.log"), "ab")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, env={**os.environ, **(env or {})}, cwd=state.path)
    state.remember(name, process.pid)
    commands = state.commands()
    commands[name] = {"argv": argv, "env": env or {}}
    write(state.file("commands.json"), json.dumps(commands, indent=1))
    return process


def stop(state: State, name: str) -> None:
    """Stop one component; `restart` starts it again."""
    if name not in state.commands():
        raise Failed(f"no component {name!r} in {state.path}; there are: {', '.join(sorted(state.commands()))}")
    pid = state.pids().get(name)
    if pid is not None:
        end(pid)


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


def create_objects(binary: str, admin: str, objects: list[dict]) -> None:
    if objects:
        kubectl(binary, admin, "apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=yaml.safe_dump_all(objects))


def pointed_here(configuration: dict, port: int, ca_pem: bytes) -> dict:
    """An admission webhook configuration calling a process on this machine, by URL: each webhook's
    Service path on 127.0.0.1:`port`, with `ca_pem` as its caBundle."""
    out = copy.deepcopy(configuration)
    for entry in out["webhooks"]:
        path = ((entry.get("clientConfig") or {}).get("service") or {}).get("path") or "/mutate"
        entry["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                 "caBundle": base64.b64encode(ca_pem).decode()}
    return out


# ----- certificates ------------------------------------------------------------------------------------

def make_pki(state: State) -> None:
    """A CA for the apiserver and the webhook, and the service-account signing pair."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from webhook.credentials import certs
    ca_cert, ca_key = certs.make_ca("local-cluster-ca")
    write(state.file("pki", "ca.crt"), ca_cert)
    write(state.file("pki", "ca.key"), ca_key, 0o600)
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    for name, dns in (("apiserver", names), ("webhook", ["localhost"])):
        cert, key = certs.make_serving_cert(ca_cert, ca_key, dns, ["127.0.0.1"])
        write(state.file("pki", f"{name}.crt"), cert)
        write(state.file("pki", f"{name}.key"), key, 0o600)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write(state.file("pki", "sa.key"), sa.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                                          serialization.NoEncryption()), 0o600)
    write(state.file("pki", "sa.pub"), sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


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
