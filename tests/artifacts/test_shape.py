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


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("webhook")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles
