"""The package's shape, as docs/development.md promises it: modules a reader can hold in mind (at
most 400 lines, classes at most 300) and imports that never run in a circle. The layers between
packages are import-linter's (setup.cfg); a cycle inside a package it does not layer is caught here."""
from __future__ import annotations

import ast
import pathlib

import grimp

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "webhook"
MODULE_LINES, CLASS_LINES = 400, 300


def test_every_module_is_at_most_400_lines_and_every_class_at_most_300():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(PACKAGE.parent)
        if text.count("\n") > MODULE_LINES:
            too_long.append(f"{where}: {text.count(chr(10))} lines")
        too_long += [f"{where}: class {node.name}, {node.end_lineno - node.lineno + 1} lines"
                     for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)
                     and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > CLASS_LINES]
    assert not too_long


NEAR_CAP = 20  # a module or class this close to its cap says why it is so large, or is split first
SIZE_NOTE = "# Near its size cap:"


def test_every_module_or_class_near_its_cap_says_why():
    """docs/development.md: the next feature in a module or class within 20 lines of its cap must
    split it, unless a `# Near its size cap:` comment says why it stays whole."""
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(PACKAGE.parent)
        if text.count("\n") > MODULE_LINES - NEAR_CAP and SIZE_NOTE not in text:
            unexplained.append(f"{where}: {text.count(chr(10))} lines")
        lines = text.splitlines()
        unexplained += [f"{where}: class {node.name}, {node.end_lineno - node.lineno + 1} lines"
                        for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)
                        and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > CLASS_LINES - NEAR_CAP
                        and not any(SIZE_NOTE in line for line in lines[node.lineno - 1:node.end_lineno])]
    assert not unexplained


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("webhook")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles


# Sorts that order the reasons' text, not a placement: (module, function).
REASONS_ONLY = {("waiting.py", "_per_level")}


def test_every_placement_sort_key_is_a_named_ordering():
    """docs/development.md: every sort key a placement choice uses is a named function of
    core/orderings.py (which an ablation can switch), never a tuple written where it sorts."""
    inline = []
    for path in sorted((PACKAGE / "placement").glob("*.py")):
        tree = ast.parse(path.read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            if (path.name, function.name) in REASONS_ONLY:
                continue
            inline += [f"{path.name}:{node.lineno} in {function.name}" for node in ast.walk(function)
                       if isinstance(node, ast.keyword) and node.arg == "key" and isinstance(node.value, ast.Lambda)
                       and isinstance(node.value.body, ast.Tuple)]
    assert not inline
