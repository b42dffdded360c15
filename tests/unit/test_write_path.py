"""The write path knows no topic by name: every topic is a contract (docs/contracts.md)."""

from __future__ import annotations

import ast

from tests.support.repo import REPO

# Where records are read, checked and written: the driver's ingest and replay-quarantine.
WRITE_PATH = [
    *sorted((REPO / "service" / "ingest").rglob("*.py")),
    *sorted((REPO / "service" / "streaming").glob("*.py")),
    REPO / "service" / "verbs" / "replay.py",
    REPO / "service" / "verbs" / "promote.py",
]
SHIPPED_NAMES = {"users", "sensors", "sensor_readings", "ingest_users", "ingest_sensors"}


def test_no_string_of_the_write_path_names_a_shipped_topic_or_table() -> None:
    named = []
    for path in WRITE_PATH:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and any(name in node.value.split("/") for name in SHIPPED_NAMES)
            ):
                named.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert len(WRITE_PATH) > 10
    assert [] == named


def test_only_mode_of_looks_at_a_contracts_write_mode() -> None:
    """A contract's mode is read by the loader and by `mode_of`; everything else asks the
    mode object (service/ingest/modes/), so that the modes are not a switch in many files."""
    allowed = {REPO / "service" / "ingest" / "modes" / "__init__.py"}
    looked = []
    for path in sorted((REPO / "service").rglob("*.py")):
        if path in allowed or (REPO / "service" / "contracts") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("events", "entities"):
                looked.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr == "mode":
                owner = node.value
                if (isinstance(owner, ast.Attribute) and owner.attr == "contract") or (
                    isinstance(owner, ast.Name) and owner.id == "contract"
                ):
                    looked.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert [] == looked
