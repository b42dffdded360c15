"""The Dockerfile: hadolint clean, pinned, non-root, tini, and built from the repo's manifests."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from service.config import Settings, env_name
from tests.support.repo import REPO

DOCKERFILE = REPO / "Dockerfile"
SETTING_NAMES = {env_name(field) for field in Settings.model_fields}


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def arguments(keyword: str) -> list[str]:
    """Arguments of every ``keyword`` instruction, in order."""
    return [rest for kw, rest in instructions() if kw == keyword]


def env() -> dict[str, str]:
    """Variables set by ENV instructions (``ENV A=1 B=2`` form), last one wins."""
    pairs = [pair for rest in arguments("ENV") for pair in shlex.split(rest) if "=" in pair]
    return dict(pair.split("=", 1) for pair in pairs)


def test_hadolint_reports_nothing() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert (0, "") == (result.returncode, result.stdout + result.stderr)


def test_every_base_image_is_pinned_by_tag_and_matches_the_pinned_runtimes() -> None:
    defaults = dict(rest.split("=", 1) for rest in arguments("ARG") if "=" in rest)
    images = [
        re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], rest.split()[0])
        for rest in arguments("FROM")
    ]
    assert len(images) >= 3, "multi-stage: jars, python, runtime"
    for image in images:
        _, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base image {image}"
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    python_minor = re.search(r">=(3\.\d+)", requires)
    assert python_minor is not None
    runtime = images[-1]
    assert runtime.startswith(f"python:{python_minor.group(1)}."), runtime
    assert "bookworm" in runtime, "the runtime's JRE 17 comes from Debian bookworm"
    assert "temurin-17" in images[0], "the Maven stage builds with Java 17, as Spark runs"


def test_jars_are_resolved_from_the_same_manifest_and_flags_as_make_jars() -> None:
    copies = " ".join(arguments("COPY"))
    assert "deploy/jvm/spark/pom.xml" in copies and "deploy/jvm/settings.xml" in copies
    (mvn,) = [rest for rest in arguments("RUN") if "mvn " in rest]
    makefile = (REPO / "Makefile").read_text()
    for flag in ("-s ../settings.xml", "dependency:copy-dependencies", "-DexcludeTransitive=true"):
        assert flag in mvn and flag in makefile, flag
    output = re.search(r"-DoutputDirectory=(\S+)", mvn)
    assert output is not None
    variables = env()
    assert output.group(1) == variables["INGEST_JARS_DIR"]
    assert variables["INGEST_JARS_DIR"] == variables["INGEST_SPARK_EXECUTOR_JARS_DIR"]
    assert f"COPY --from=jars {output.group(1)} {output.group(1)}" in [
        f"COPY {rest}" for rest in arguments("COPY")
    ]
    # The typed fast path's checker, built as `make jars` builds it, lands beside them.
    assert "jvm/checker" in copies
    for step in ("jvm/checker/pom.xml -Dmaven.test.skip=true package", "cp "):
        assert step in mvn and step in makefile, step
    assert f"jvm/checker/target/lakehouse-ingest-checker-1.jar {output.group(1)}/" in mvn


def test_python_packages_are_installed_with_the_lock_as_constraints() -> None:
    installs = [rest for rest in arguments("RUN") if "pip install" in rest]
    assert installs
    for command in installs:
        assert "-c requirements.lock" in command, command


def test_every_ingest_variable_it_sets_is_a_setting_and_no_secret_is_baked_in() -> None:
    names = set(env()) | {rest.split("=")[0] for rest in arguments("ARG")}
    ingest = {n for n in names if n.startswith(("INGEST_", "AWS_"))}
    assert ingest <= SETTING_NAMES, ingest - SETTING_NAMES
    assert not [n for n in names if re.search(r"SECRET|PASSWORD|TOKEN|ACCESS_KEY", n)]


def test_runs_as_non_root_under_tini_with_the_service_as_entrypoint() -> None:
    (user,) = arguments("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "numeric non-root uid (runAsNonRoot can verify it)"
    assert ["tini", "--", "lakehouse-ingest"] == json.loads(arguments("ENTRYPOINT")[-1])
    assert ["run"] == json.loads(arguments("CMD")[-1])
    assert any("tini" in rest and "apt-get install" in rest for rest in arguments("RUN"))


def test_writable_paths_are_only_tmp_and_the_scratch_directory() -> None:
    variables = env()
    for name in ("HOME", "SPARK_LOCAL_DIRS", "INGEST_STORAGE_ROOT"):
        assert variables[name].startswith("/var/lib/lakehouse-ingest"), name
    assert ["/var/lib/lakehouse-ingest"] == arguments("WORKDIR")[-1:]


@pytest.mark.parametrize(
    "source",
    [
        "pyproject.toml",
        "requirements.lock",
        "README.md",
        "service",
        "jvm/checker/pom.xml",
        "jvm/checker/src",
    ],
)
def test_the_build_context_allow_list_includes_what_the_image_copies(source: str) -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in lines, "the context is an allow-list"
    assert any(line.rstrip("/") == f"!{source}" for line in lines), source


def test_every_package_the_service_imports_is_a_runtime_dependency() -> None:
    """The image installs only ``dependencies``: a module from a dev extra (boto3 once)
    imports in the test venv and fails in the image."""
    imported: set[str] = set()
    for path in (REPO / "service").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"service"}
    distributions = packages_distributions()
    needed = {canonical(dist) for module in third_party for dist in distributions[module]}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {canonical(re.split(r"[=<>\[ ;]", spec)[0]) for spec in project["dependencies"]}
    assert set() == needed - declared


def canonical(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
