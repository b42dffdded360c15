"""The Python the runbooks feed the service's container (``python - <<'PY'``) compiles and
imports only what the service has: a moved function fails here, not at 3 a.m."""

from __future__ import annotations

import ast
import importlib

from tests.support.runbooks import runbook_commands


def test_every_runbook_python_script_compiles_and_imports_what_exists() -> None:
    scripts = [
        c
        for c in runbook_commands()
        if c.in_container is not None and c.words[-2:] == ("python", "-")
    ]
    assert len(scripts) >= 4
    missing = []
    for command in scripts:
        assert command.stdin is not None, command.line
        tree = ast.parse(command.stdin, filename=command.page)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = importlib.import_module(node.module)
                missing += [
                    f"{command.page}: {node.module}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)
    assert [] == missing
