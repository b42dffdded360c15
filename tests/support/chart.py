"""The Helm chart rendered by the pinned helm (`make tools`), as the deploy and image tests
read it."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import default_cache_dir
from tests.support.repo import REPO

CHART = REPO / "helm" / "lakehouse-ingest"
MONITORING_API = "monitoring.coreos.com/v1"
NAMESPACE = "lakehouse"
# Rendering target, explicit so the output does not depend on how helm was built.
RENDER_KUBE_VERSION = "1.30.0"


def helm() -> str:
    """The pinned helm binary (`make tools`)."""
    binary = default_cache_dir() / "bin" / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make tools`")
    return str(binary)


def template(
    values: str | None,
    monitoring_api: bool,
    *settings: str,
    chart: Path = CHART,
    flags: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run `helm template` of release "ingest" in NAMESPACE; ``settings`` are `--set` flags,
    ``flags`` any other."""
    command = [helm(), "template", "ingest", str(chart), "--namespace", NAMESPACE, *flags]
    command += ["--kube-version", RENDER_KUBE_VERSION]
    if values:
        command += ["--values", values]
    if monitoring_api:
        command += ["--api-versions", MONITORING_API]
    for setting in settings:
        command += ["--set", setting]
    return subprocess.run(command, capture_output=True, text=True, check=False)


@cache
def render(values: str | None, monitoring_api: bool, *settings: str) -> tuple[dict[str, Any], ...]:
    """`helm template` output as a list of manifests."""
    result = template(values, monitoring_api, *settings)
    assert 0 == result.returncode, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
