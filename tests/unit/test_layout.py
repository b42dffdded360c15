"""The shape of service/: definitions a reader can hold at once (docs/architecture.md)."""

from __future__ import annotations

import ast

from tests.support.repo import REPO

LONGEST_DEFINITION = 200
LONGEST_MAIN = 40


def _definitions() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted((REPO / "service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                found.append((str(path.relative_to(REPO)), node.name, lines))
    return found


def test_no_definition_of_the_service_is_over_200_lines() -> None:
    definitions = _definitions()
    assert len(definitions) > 500
    assert [] == [d for d in definitions if d[2] > LONGEST_DEFINITION]


def test_main_only_parses_dispatches_and_maps_exit_codes() -> None:
    [(_, _, lines)] = [d for d in _definitions() if d[:2] == ("service/__main__.py", "main")]
    assert lines < LONGEST_MAIN
