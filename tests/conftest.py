"""Shared fixtures: the demo cluster view, the Flask app, a real gunicorn over TLS, and the fake API server.

`ApiServer` talks to the webhook the way kube-apiserver does and checks every answer against the
rules the apiserver enforces on an AdmissionResponse
(https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/);
`tls_server` starts one real server per session (`python -m webhook serve` with certificates from
certs.py) on a free 127.0.0.1 port.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import pathlib
import random
import socket
import subprocess
import sys
import time
import uuid
import dataclasses
from dataclasses import dataclass

import jsonpatch
import pytest
import requests
from kubernetes.client import ApiClient, Configuration

from tests.integration.fakeapiserver import FakeApiServer
from tests.fixtures.builders import schema_error
from webhook.credentials import certs
from webhook.kube import demo
from webhook.serving.app import create_app
from webhook.admission import make_review
from webhook.cli import file_index
from webhook.cli.live import live_view
from webhook.kube.clusterview import ApiFeed, Pacing
from webhook.settings.config import Config
from webhook.serving.metrics import Metrics
from webhook.objects import patch, subject

ROOT = pathlib.Path(__file__).resolve().parents[1]
START_TIMEOUT_SECONDS = 60


class FakeClock:
    """A clock tests move by hand (`clock.now += ttl`)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def restore_logging():
    """`main()` configures the root logger as the process would; each test starts from pytest's."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def nothing_remembered_across_tests():
    """What admission remembers between reviews (patches by shape, specs that passed their checks)
    starts empty in each test, so that what one test sent never decides how another is served."""
    patch._checked_operations.cache_clear()
    subject._PASSED_SPECS.clear()


@pytest.fixture
def config() -> Config:
    return Config()


@pytest.fixture
def index(config):
    view, _ = file_index(config, demo.demo_cluster())
    return view


@pytest.fixture
def metrics() -> Metrics:
    return Metrics.create()


@pytest.fixture
def app(config, index, metrics):
    return create_app(config, index, lambda: (True, ""), metrics)


@pytest.fixture
def client(app):
    return app.test_client()


def patched_object(sent: dict, answer: dict) -> dict:
    """Check an AdmissionReview answer as kube-apiserver does and return the object after its patch."""
    assert answer["apiVersion"] == sent["apiVersion"] and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    assert ("patch" in response) == ("patchType" in response), "patch and patchType go together"
    obj = sent["request"]["object"]
    if "patch" not in response:
        return obj
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(patch, list) and patch
    return jsonpatch.apply_patch(obj, patch)


def assert_valid_kubernetes_object(obj: dict) -> None:
    assert schema_error(obj) is None, schema_error(obj)


@dataclass
class ApiServer:
    """A client that calls the webhook as kube-apiserver does: TLS verified against our CA for the
    name `localhost`, POST to /mutate?timeout=Ns, JSON AdmissionReview in and out."""

    base_url: str
    ca: str
    session: requests.Session

    def post(self, review: dict, timeout_seconds: int = 5) -> requests.Response:
        return self.session.post(f"{self.base_url}/mutate?timeout={timeout_seconds}s", json=review,
                                 verify=self.ca, timeout=timeout_seconds)

    def admit(self, review: dict) -> dict:
        """Send a review, check the answer as the apiserver would, return the patched object."""
        answer = self.post(review)
        assert answer.status_code == 200, answer.text
        assert answer.headers["Content-Type"].startswith("application/json")
        return patched_object(review, answer.json())

    def get(self, path: str) -> requests.Response:
        return self.session.get(f"{self.base_url}{path}", verify=self.ca, timeout=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    process: subprocess.Popen
    port: int
    paths: certs.CertPaths
    log: pathlib.Path
    metrics_port: int
    client_cert: tuple[str, str] | None = None  # presented when the server requires one (--client-ca)

    def client(self) -> ApiServer:
        session = requests.Session()
        session.cert = self.client_cert
        return ApiServer(f"https://localhost:{self.port}", self.paths.ca, session)

    def metrics(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text


def start_server(workdir: pathlib.Path, *extra: str, cert: str | None = None, key: str | None = None,
                 ca: str | None = None, client_cert: tuple[str, str] | None = None) -> RunningServer:
    """`python -m webhook serve` on a free port, with the given certificate or fresh ones;
    returns once /healthz answers."""
    if cert and key and ca:
        paths = certs.CertPaths(ca, cert, key)
    else:
        paths = certs.write_certs(str(workdir / "tls"), "topology-webhook", "default")
    port, metrics_port = free_port(), free_port()
    log = workdir / "server.log"
    command = [sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}",
               "--metrics-bind", f"127.0.0.1:{metrics_port}", "--cert", paths.cert, "--key", paths.key, *extra]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the server picks its own
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=workdir, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    server = RunningServer(process, port, paths, log, metrics_port, client_cert)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if server.client().get("/healthz").status_code == 200:
                return server
        except requests.ConnectionError:
            time.sleep(0.2)
    stop_server(server)
    raise RuntimeError(f"server did not answer /healthz within {START_TIMEOUT_SECONDS} s:\n{log.read_text()}")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=10)


@pytest.fixture(scope="session")
def tls_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("server"))
    yield server
    stop_server(server)


@pytest.fixture
def apiserver(tls_server) -> ApiServer:
    return tls_server.client()


def review_of(obj: dict, version: str = "v1") -> dict:
    """A CREATE review for an object as the apiserver sends it, with a fresh uid."""
    review = make_review(obj, uid=str(uuid.uuid4()))
    return {**review, "apiVersion": f"admission.k8s.io/{version}"}


# ----- the fake API server and live views over it ------------------------------------------------

LEAF = "topology.scheduler/leaf"
LABELS = {"topology.kubernetes.io/zone": "zone-a", "topology.scheduler/spine": "spine-1", LEAF: "leaf-1"}


def eventually(check, timeout: float = 10.0, what: str = "condition"):
    """Poll `check` until it returns something truthy, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def fake() -> FakeApiServer:
    """A local fake of kube-apiserver (tests/integration/fakeapiserver.py), stopped at teardown."""
    server = FakeApiServer(bookmark_interval=0.2).start()
    yield server
    server.stop()


@pytest.fixture
def make_view(clock):
    views = []

    def make(server: FakeApiServer, config: Config = Config(), **overrides) -> ApiFeed:
        """serve's composition (cli/live.py) against `server`; overrides of `Pacing`'s fields pace the feed."""
        paced = {field.name for field in dataclasses.fields(Pacing)}
        pacing = dict(backoff_base=0.01, backoff_cap=0.2, watch_timeout_seconds=5, expire_interval_seconds=0.05)
        pacing.update({name: value for name, value in overrides.items() if name in paced})
        settings = dict(clock=clock, rng=random.Random(7), pacing=Pacing(**pacing))
        settings.update({name: value for name, value in overrides.items() if name not in paced})
        view = live_view(config, ApiClient(Configuration(host=server.url)), **settings)
        views.append(view)
        return view

    yield make
    for view in views:
        assert view.stop(timeout=5), "view threads did not stop within 5s"


def write_kubeconfig(path, server: FakeApiServer) -> str:
    path.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{server.url}"}}}}]
users: [{{name: me, user: {{token: abc}}}}]
contexts: [{{name: here, context: {{cluster: fake, user: me}}}}]
current-context: here
""")
    return str(path)
