"""Writes .ci/constraints-test.txt: the exact versions of setup.cfg's `test` extras and of everything
they pull in that the runtime does not (the runtime's are .ci/constraints.txt), as installed in the
environment this runs in. tests/artifacts/test_packaging.py checks the file is what this writes.

To move a test tool on (docs/development.md#pinned-versions):

    .venv/bin/pip install -c .ci/constraints.txt -U pytest    # without the old pins of the tools
    .venv/bin/python .ci/pin_test_tools.py                     # write them down again
"""
from __future__ import annotations

import configparser
import importlib.metadata
import pathlib
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / ".ci" / "constraints-test.txt"
HEADER = """\
# Exact versions of the test tools: setup.cfg's `test` extras and everything they pull in that the
# runtime does not (the runtime's are in constraints.txt), as installed in the tested environment.
# Written by `python .ci/pin_test_tools.py`, not by hand; .ci/run installs with both files.
"""


def requirements(section: str, key: str) -> list[Requirement]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return [Requirement(line) for line in setup[section][key].strip().splitlines()]


def closure(wanted: list[Requirement]) -> set[str]:
    """The distributions `wanted` needs, themselves included, as installed here."""
    pending, seen = list(wanted), set()
    while pending:
        name = canonicalize_name(pending.pop().name)
        if name in seen:
            continue
        seen.add(name)
        for spec in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement)
    return seen


def render() -> str:
    runtime = closure(requirements("options", "install_requires"))
    tools = closure(requirements("options.extras_require", "test")) - runtime
    return HEADER + "".join(f"{name}=={importlib.metadata.version(name)}\n" for name in sorted(tools))


if __name__ == "__main__":
    OUT.write_text(render())
    sys.exit(0)
