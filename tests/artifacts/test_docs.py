"""The docs a newcomer reads hold together: every relative link and `#anchor` resolves, every
repository path and `webhook` import they cite exists, the README stays a short door, and nothing
in code, tests, benchmarks, hack/ or the docs points at files outside the repository."""
from __future__ import annotations

import ast
import importlib
import pathlib
import re
import subprocess

import pytest

from tests.fixtures.shared import ci_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
README_LIMIT_BYTES = 12_000
DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "charts" / "topology-webhook" / "README.md",
               *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title"; [label]: target definitions.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
REPO_PATH = re.compile(r"(?:webhook|tests|bench|charts|examples|docs|\.ci)/[\w./-]*")
WEBHOOK_IMPORT = re.compile(r"\bfrom (webhook(?:\.\w+)*) import (\w+)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (link targets and markup dropped),
    lowercased, punctuation other than '-' and '_' removed, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every heading anchor of a markdown file; a repeated heading gets -1, -2... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def link_targets(path: pathlib.Path) -> list[str]:
    targets = []
    for line in prose_lines(path.read_text()):
        line = CODE_SPAN.sub("code", line)  # `[x](y)` inside code is not a link
        targets += INLINE_LINK.findall(line)
        definition = LINK_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
    return targets


def broken_links(path: pathlib.Path) -> list[str]:
    broken = []
    for target in link_targets(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    return broken


def doc_id(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_docs_checked_are_the_ones_a_reader_meets():
    names = {doc_id(p) for p in DOCS}
    assert {"README.md", "docs/README.md", "bench/README.md", "charts/topology-webhook/README.md"} <= names
    assert len([n for n in names if n.startswith("docs/")]) > 10


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_every_relative_link_and_anchor_resolves(path):
    broken = broken_links(path)
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_every_repository_path_cited_exists(path):
    cited = {m.group().rstrip(".") for span in CODE_SPAN.finditer(path.read_text())
             for m in [REPO_PATH.fullmatch(span.group(2).strip())] if m}
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_every_webhook_import_in_the_docs_works(path):
    missing = []
    for module, name in WEBHOOK_IMPORT.findall(path.read_text()):
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            missing.append(f"from {module} import {name}")
    assert not missing, "\n".join(missing)


def test_every_docs_page_is_linked_from_the_readme_or_the_docs_index():
    linked = {(index.parent / t.partition("#")[0]).resolve()
              for index in (ROOT / "README.md", ROOT / "docs" / "README.md") for t in link_targets(index)}
    unlinked = sorted(doc_id(p) for p in (ROOT / "docs").rglob("*.md") if p.resolve() not in linked)
    assert not unlinked, "not linked from README.md or docs/README.md: " + ", ".join(unlinked)


def test_the_readme_is_a_short_door():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= README_LIMIT_BYTES, f"README.md is {len(readme)} bytes; move detail into docs/"
    text = readme.decode()
    # The two set-up commands come first, as they are, and the README links the docs index.
    assert text.index("## Two commands") < text.index("## Five-minute walk-through")
    assert "bash .ci/run\n" in text and "](docs/README.md)" in text


POINTED_FROM = ("webhook", "tests", "bench", "hack", "docs")


def repository_files(*tops: str) -> list[str]:
    """The files under `tops` that are the repository's: tracked or new, never what git ignores
    (hack/kube/.cache's binaries, caches, venvs)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *tops],
                            cwd=ROOT, capture_output=True, check=True).stdout
    return sorted(name for name in listed.decode().split("\0") if name and (ROOT / name).is_file())


def test_nothing_in_code_tests_benchmarks_hack_or_docs_points_outside_the_repository():
    outside = "/".join(("..", "shared"))  # spelled apart so this file does not match itself
    files = repository_files(*POINTED_FROM)
    assert {name.split("/")[0] for name in files} == set(POINTED_FROM)
    hits = [name for name in files if outside.encode() in (ROOT / name).read_bytes()]
    assert not hits, "cite the upstream source instead: " + ", ".join(hits)


def reference_docs():
    """.ci/reference_docs.py, the generator of the reference pages' generated parts."""
    return ci_script("reference_docs")


GENERATED_PAGES = ["docs/reference/settings.md", "docs/reference/metrics.md", "docs/reference/cli.md",
                   "docs/reference/annotations.md", "docs/reference/what-we-write.md", "docs/reference/kinds.md"]


def test_the_generated_pages_are_the_ones_the_generator_writes():
    assert sorted(reference_docs().PAGES) == sorted(GENERATED_PAGES)


@pytest.mark.parametrize("page", GENERATED_PAGES)
def test_each_reference_page_says_what_the_code_does(page):
    # settings.md from the Config fields' docs and the loader's bounds, metrics.md from the registry,
    # cli.md from the argument parser; the hand-written prose around the generated part stays.
    assert (ROOT / page).read_text() == reference_docs().render(page), \
        "the code and the page differ: run .venv/bin/python .ci/reference_docs.py"


@pytest.mark.parametrize("tuple_name, module, page", [
    ("INPUT_ANNOTATIONS", "webhook.objects.user_annotations", "docs/reference/annotations.md"),
    ("OUTPUT_ANNOTATIONS", "webhook.core.injection", "docs/reference/what-we-write.md"),
])
def test_every_annotation_we_read_or_write_has_its_row_in_order(tuple_name, module, page):
    keys = getattr(importlib.import_module(module), tuple_name)
    text = (ROOT / page).read_text()
    rows = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `topology.scheduler/")]
    assert rows == list(keys)


PLANTED = """\
PREFIX = "example.io/"
# Read from the object. Default: none.
TAKEN = PREFIX + "taken"
SILENT = PREFIX + "silent"
# A note for the code's readers only.

UNDESCRIBED = PREFIX + "undescribed"
TUPLE = (TAKEN,) + (SILENT, UNDESCRIBED)
"""


def test_an_annotation_without_a_comment_of_its_own_stops_the_generator(tmp_path, monkeypatch):
    (tmp_path / "planted_annotations.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match="example.io/silent, example.io/undescribed: say what it is"):
        reference_docs().annotations_of("TUPLE", "planted_annotations")


def strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_every_outcome_is_documented_and_given_somewhere():
    from webhook.admission import OUTCOMES, AdmissionOutcome
    assert set(OUTCOMES) == set(AdmissionOutcome)
    given = set()
    for path in (ROOT / "webhook" / "admission").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "AdmissionOutcome"):
                given.add(AdmissionOutcome[node.attr])
    assert given == set(AdmissionOutcome), "an outcome no admission gives"


@pytest.mark.parametrize("path, call, constant", [
    ("webhook/kube/scaleups.py", "on_result", "webhook.kube.scaleups:RESULTS"),
    ("webhook/credentials/access.py", "failed", "webhook.credentials.access:FAILURE_REASONS"),
    ("webhook/serving/app.py", "refuse", "webhook.serving.app:REJECTED_REASONS"),
])
def test_every_label_value_counted_is_one_the_metrics_page_documents(path, call, constant):
    module, _, name = constant.partition(":")
    documented = set(getattr(importlib.import_module(module), name))
    counted = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == call \
                and node.args:
            first = node.args[0]
            counted |= strings(first)
            if isinstance(first, ast.JoinedStr):  # f"http_{code}": documented as http_<code>
                counted = {v for v in counted if v != "http_"} | {"http_<code>"}
    assert counted and counted <= documented, sorted(counted - documented)


@pytest.mark.parametrize("heading, anchor", [
    ("Five-minute walk-through", "five-minute-walk-through"),
    ("2. Install the chart", "2-install-the-chart"),
    ("`serve`: certificate files are reloaded", "serve-certificate-files-are-reloaded"),
    ("RBAC of `selfManaged`", "rbac-of-selfmanaged"),
    ("Settings file (`--config`)", "settings-file---config"),
    ("What claims cost, and why one Lease", "what-claims-cost-and-why-one-lease"),
    ("See [the docs](docs/README.md) now", "see-the-docs-now"),
])
def test_anchors_follow_githubs_rules(heading, anchor):
    assert slug(heading) == anchor
