"""What a wheel and an sdist carry, and that the dependency floors CI tests are the ones setup.cfg states."""
from __future__ import annotations

import configparser
import pathlib
import re
import subprocess
import sys
import tarfile
import zipfile

from tests.fixtures.shared import ci_script

ROOT = pathlib.Path(__file__).resolve().parents[2]


def install_requires() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = (line.strip() for line in cfg["options"]["install_requires"].splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def floor_pins() -> dict[str, str]:
    lines = (line.strip() for line in (ROOT / ".ci" / "floor.txt").read_text().splitlines())
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def test_every_runtime_dependency_has_a_floor_and_ci_pins_exactly_that_floor():
    floors = {}
    for requirement in install_requires():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,<[0-9.]+)?", requirement)
        assert match, f"{requirement!r} states no floor as NAME>=VERSION"
        floors[match[1].lower()] = match[2]
    pinned = {name.lower(): version for name, version in floor_pins().items()}
    assert pinned.keys() == floors.keys()
    for name, floor in floors.items():
        # `>=3.0` is met first by 3.0.0: the pin may only pad the floor with zeros.
        assert pinned[name] == floor or pinned[name].startswith(floor + "."), name
        assert set(pinned[name][len(floor):]) <= {".", "0"}, name


def test_wheel_and_sdist_carry_the_license(tmp_path):
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (license_name,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(license_name).decode() == license_text
        (metadata_name,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata_name).decode()
    assert "License-File: LICENSE" in metadata
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.endswith("/LICENSE")]
        assert archive.extractfile(member).read().decode() == license_text


def test_the_test_tools_are_pinned_at_the_versions_the_tests_run_with():
    """Every test extra and what it pulls in beyond the runtime, exactly as installed here."""
    assert (ROOT / ".ci" / "constraints-test.txt").read_text() == ci_script("pin_test_tools").render(), \
        "run: .venv/bin/python .ci/pin_test_tools.py"
    pinned = {line.partition("==")[0] for line in (ROOT / ".ci" / "constraints-test.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert {"pytest", "mypy", "helm-python-sdk", "hypothesis", "cel-python", "kubernetes-validate"} <= pinned


def test_ci_installs_the_test_tools_with_their_pins():
    run = (ROOT / ".ci" / "run").read_text()
    assert "-c .ci/constraints.txt -c .ci/constraints-test.txt -e '.[test]'" in run

