"""The container image's recipe, checked by structure (no container engine runs here)."""
from __future__ import annotations

import configparser
import fnmatch
import functools
import importlib.metadata
import json
import re
import shlex
from pathlib import Path

import helm_python
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.fixtures.shared import ci_script
from webhook.serving.paths import DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"


def instructions(dockerfile: Path = ROOT / "Dockerfile") -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    logical, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        logical.append((keyword.upper(), rest.strip()))
        pending = ""
    return logical


def stages() -> list[list[tuple[str, str]]]:
    """Instructions per build stage; global ARGs before the first FROM are left out."""
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def exec_form(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    (value,) = [rest for kw, rest in stage if kw == keyword]
    return json.loads(value)


def test_multi_stage_on_the_same_slim_python_3_11_base():
    (base_arg,) = [rest for kw, rest in instructions() if kw == "ARG" and rest.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim(-\w+)?", base_arg)
    froms = [stage[0][1] for stage in stages()]
    assert froms == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE}"]  # the venv's interpreter path exists in both


def test_final_stage_gets_only_the_built_venv_and_installs_nothing():
    stage = final_stage()
    copies = [rest for kw, rest in stage if kw in ("COPY", "ADD")]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    runs = " ".join(rest for kw, rest in stage if kw == "RUN")
    for tool in ("apt-get install", "pip install", "gcc", "build-essential"):
        assert tool not in runs, f"the final stage must not run {tool!r}"
    assert "pip uninstall" in runs  # the base's pip and setuptools leave the final image


def test_final_image_carries_the_oci_labels_with_license_version_revision_and_base():
    labels = " ".join(rest for kw, rest in final_stage() if kw == "LABEL")
    for key in ("title", "description", "licenses", "version", "revision", "created", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    assert ("ARG", "PYTHON_IMAGE") in final_stage()  # the base's name (a digest, when pinned) reaches its label


def test_builder_installs_pinned_wheels_without_a_cache():
    builder = stages()[0]
    env = " ".join(rest for kw, rest in builder if kw == "ENV")
    assert "PIP_NO_CACHE_DIR=1" in env
    assert "PIP_CONSTRAINT=/src/.ci/constraints.txt" in env
    assert ".ci/constraints.txt .ci/constraints.txt" in [rest for kw, rest in builder if kw == "COPY"]
    (install,) = [rest for kw, rest in builder if kw == "RUN" and " install " in rest]
    assert "--only-binary=:all:" in install and "pip --python /opt/venv/bin/python check" in install


@functools.cache
def chart_pod_spec() -> dict:
    chart = helm_python.Chart.load(ROOT / "charts/topology-webhook")
    deployment = yaml.safe_load(chart.render({}, name="tw", namespace="ns")["topology-webhook/templates/deployment.yaml"])
    return deployment["spec"]["template"]["spec"]


def test_runs_as_the_non_root_user_the_chart_asks_for():
    (user,) = [rest for kw, rest in final_stage() if kw == "USER"]
    uid, _, gid = user.partition(":")
    pod_security = chart_pod_spec()["securityContext"]
    assert int(uid) == pod_security["runAsUser"] != 0 and int(gid) == pod_security["runAsGroup"]


def test_no_healthcheck_kubernetes_probes_do_that():
    assert all(kw != "HEALTHCHECK" for kw, _ in instructions())


def test_entrypoint_serves_with_the_paths_and_port_the_chart_mounts():
    entrypoint = exec_form(final_stage(), "ENTRYPOINT")
    scripts = configparser.ConfigParser()
    scripts.read(ROOT / "setup.cfg")
    console = dict(line.split(" = ") for line in scripts["options.entry_points"]["console_scripts"].strip().splitlines())
    assert entrypoint == ["topology-webhook"] and "topology-webhook" in console
    cmd = exec_form(final_stage(), "CMD")
    (container,) = chart_pod_spec()["containers"]
    # The chart runs the image's command, then what only a release knows (tls.mode selfManaged: the
    # names of its Secret, Service and webhook configuration).
    assert container["args"][:len(cmd)] == cmd and "--tls-secret" in container["args"][len(cmd):]
    assert [rest for kw, rest in final_stage() if kw == "EXPOSE"] == [f"{DEFAULT_PORT} 9090"]


def pins() -> dict[str, str]:
    lines = [line for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+", line) for line in lines), lines
    return {canonicalize_name(name): version for name, _, version in (line.partition("==") for line in lines)}


def runtime_closure() -> set[str]:
    """install_requires of setup.cfg and everything they need, as installed in the tested environment."""
    pins_of = ci_script("pin_test_tools")
    return pins_of.closure(pins_of.requirements("options", "install_requires"))


def test_constraints_pin_exactly_the_runtime_dependencies():
    assert set(pins()) == runtime_closure()


def test_pinned_versions_satisfy_setup_cfg_and_match_the_tested_environment():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    pinned = pins()
    for line in setup["options"]["install_requires"].strip().splitlines():
        requirement = Requirement(line)
        assert requirement.specifier.contains(pinned[canonicalize_name(requirement.name)]), line
    for name, version in pinned.items():
        assert importlib.metadata.version(name) == version, f"{name}: pinned {version}, tested with {importlib.metadata.version(name)}"


def sent_to_the_build(relative: str) -> bool:
    """Whether .dockerignore lets a path into the build context (the last matching rule wins)."""
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    parts = relative.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]  # a rule on a directory covers its files
    sent = True
    for rule in rules:
        pattern, negated = (rule[1:], True) if rule.startswith("!") else (rule, False)
        if any(fnmatch.fnmatch(prefix, pattern.replace("**/", "*")) for prefix in prefixes):
            sent = negated
    return sent


def test_build_context_holds_what_the_builder_copies():
    copied = [src for kw, rest in stages()[0] if kw == "COPY" for src in shlex.split(rest)[:-1]]
    for source in copied:
        files = [ROOT / source] if (ROOT / source).is_file() else sorted((ROOT / source).rglob("*.py"))
        assert files, source
        for path in files:
            assert sent_to_the_build(path.relative_to(ROOT).as_posix()), path


@pytest.mark.parametrize("path", [
    "certs/ca.pem", "certs/tls.key", "webhook/__pycache__/config.cpython-311.pyc", ".git/config",
    ".venv/bin/python", "tests/artifacts/test_chart.py", "charts/topology-webhook/values.yaml", ".ci/run",
])
def test_build_context_leaves_out_keys_caches_and_everything_else(path):
    assert not sent_to_the_build(path)
