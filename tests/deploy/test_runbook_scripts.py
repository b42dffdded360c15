"""What the runbooks give on-call to run: the Python they feed the service's container
(``python - <<'PY'``) compiles and imports only what the service has, a command that
starts Spark runs in the toolbox, and their PromQL parses and names the chart's job."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.runbooks import SPARK_VERBS, runbook_commands, runbook_promql

# The chart's scrape job, the Service's name (tests/deploy/test_chart.py checks it), as the
# runbooks write it; Compose's is `lakehouse-ingest`.
CHART_JOB = "<release>-lakehouse-ingest"
_JOB_MATCHER = re.compile(r'\bjob\s*=~?\s*"([^"]*)"')


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


def test_every_runbook_command_that_starts_spark_runs_in_the_toolbox() -> None:
    """A second Spark JVM in the driver's container (its memory sized for one) risks an
    OOM kill of the driver: replay-quarantine (its dry run too), migrate, promote."""
    spark = [c for c in runbook_commands() if c.starts_spark]
    assert {"--dry-run"} <= {w for c in spark for w in c.words}, "the replay's dry run"
    wrong = [f"{c.page}: {c.line}" for c in spark if c.exec_target != "$TOOLBOX"]
    assert [] == wrong


def test_the_spark_verbs_are_the_commands_that_build_a_spark_session() -> None:
    verbs = Path(importlib.import_module("service.verbs").__file__ or "").parent
    building = {
        path.stem.replace("replay", "replay-quarantine")
        for path in verbs.glob("*.py")
        if "build_spark(" in path.read_text()
    }
    assert set(SPARK_VERBS) - {"run"} == building


def test_every_runbook_promql_parses(tmp_path: Path) -> None:
    expressions = runbook_promql()
    assert len(expressions) > 40
    rules = [
        {"record": f"runbook:{i}", "expr": e.expr.replace("…", "x")}
        for i, e in enumerate(expressions)
    ]
    path = tmp_path / "runbooks.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": rules}]}))
    binary = shutil.which("promtool")
    assert binary, "promtool not installed: run `make prometheus`"
    result = subprocess.run(
        [binary, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert 0 == result.returncode, result.stdout + result.stderr


def test_every_job_a_runbook_names_is_the_charts() -> None:
    jobs = {f"{e.page}: {job}" for e in runbook_promql() for job in _JOB_MATCHER.findall(e.expr)}
    silenced = {
        f"{c.page}: {w.partition('=')[2]}"
        for c in runbook_commands()
        if c.words[:1] == ("amtool",)
        for w in c.words
        if w.startswith("job=")
    }
    assert jobs and silenced
    assert set() == {j for j in jobs if not j.endswith(f": {CHART_JOB}")}
    assert set() == {j for j in silenced if not j.endswith(": $RELEASE-lakehouse-ingest")}
