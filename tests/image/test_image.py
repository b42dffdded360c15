"""The image, built and run: the service ingests in it, it is lean, and the deployments
run it as it is."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from devstack import free_port

from tests.support.chart import render
from tests.support.image import Container
from tests.support.kafka import topic_coordinates
from tests.support.lake import Lake
from tests.support.repo import REPO
from tests.support.runbooks import runbook_commands

# The image as built here, measured (docs/deploy.md): a limit that catches a layer
# grown by accident (a build tool, a cache, a second copy of the jars).
SIZE_LIMIT_BYTES = 2_200_000_000


def entrypoint(config: dict[str, Any], *args: str) -> list[str]:
    """The image's entrypoint followed by ``args``, as a container runtime starts it."""
    return [*config["Entrypoint"], *args]


def test_the_service_ingests_in_the_image_and_the_lake_reconciles(
    container: Container, image_config: dict[str, Any], lake: Lake
) -> None:
    env = lake.env(INGEST_LOG_LEVEL="WARNING")
    generated = container.run(
        entrypoint(
            image_config,
            "generate",
            "--users",
            "20",
            "--readings",
            "3000",
            "--seed",
            "7",
            "--bad-fraction",
            "0.05",
            "--duplicate-fraction",
            "0.05",
        ),
        env,
    )
    assert 0 == generated.returncode, generated.stderr
    run = container.run(entrypoint(image_config, "run", "--available-now"), env, timeout=600)
    assert 0 == run.returncode, run.stdout[-4000:] + run.stderr[-4000:]
    errors = [line for line in run.stdout.splitlines() if '"level":"error"' in line]
    assert [] == errors

    reconcile = container.run(entrypoint(image_config, "reconcile", "--json"), env)
    assert 0 == reconcile.returncode, reconcile.stdout + reconcile.stderr
    rows = lake.delta_rs_rows()
    produced = len(topic_coordinates(lake.bootstrap_servers, lake.sensors_topic))
    assert 3000 == produced == rows["bronze/sensors"]
    landed = rows["silver/sensor_readings"] + rows["silver/quarantine"]
    assert produced == landed + rows["silver/sensor_duplicates"]
    assert 0 < rows["silver/quarantine"] and 0 < rows["silver/sensor_duplicates"]
    users = len(topic_coordinates(lake.bootstrap_servers, lake.users_topic))
    assert users == rows["bronze/users"]

    shown = container.run(
        entrypoint(
            image_config, "show", "silver/sensor_readings", "--limit", "0", "--format", "json"
        ),
        env,
    )
    assert 0 == shown.returncode, shown.stderr
    assert rows["silver/sensor_readings"] == len(shown.stdout.splitlines())


def test_the_driver_in_the_image_serves_health_status_and_every_runbook_command(
    container: Container, image_config: dict[str, Any], lake: Lake, tmp_path: Path
) -> None:
    port = free_port()
    env = lake.env(INGEST_HTTP_PORT=str(port), INGEST_STOP_TIMEOUT_SECONDS="60")
    lake.generate("--users", "10", "--readings", "300", "--seed", "3", "--bad-fraction", "0.1")
    log = tmp_path / "driver.log"
    driver = container.start(entrypoint(image_config, *image_config["Cmd"]), env, log)
    try:
        _wait_ready(port, driver, log)
        _wait_for(log, '"query": "ingest_sensors"', driver, event="batch_written")
        # The compose healthcheck, as compose runs it in the container.
        compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
        check = compose["services"]["ingest"]["healthcheck"]["test"]
        assert "CMD" == check[0]
        health = container.run([arg.replace(":8080", f":{port}") for arg in check[1:]], env)
        assert 0 == health.returncode, health.stderr
        started = time.monotonic()
        status = container.run(entrypoint(image_config, "status", "--json"), env)
        took = time.monotonic() - started
        assert 0 == status.returncode, status.stderr
        report = json.loads(status.stdout)
        assert report["driver"] is not None, report.get("driver_error")
        assert {"ingest_users", "ingest_sensors"} <= {q["query"] for q in report["queries"]}
        assert took < 10, f"status took {took:.1f}s"

        # Every command the runbooks run in the service's container, run in the image
        # beside the live driver (port 8080 is this driver's port here).
        commands = [c for c in runbook_commands() if c.in_container]
        assert len(commands) > 25
        outputs = {}
        for command in commands:
            assert command.in_container is not None
            args = [word.replace(":8080", f":{port}") for word in command.in_container]
            done = container.run(args, env, stdin=command.stdin)
            if args[:2] == ["lakehouse-ingest", "replay-quarantine"] and "--dry-run" not in args:
                # The page runs it with the driver stopped; beside this live one it must
                # refuse (exit 3: the lease is held) and write nothing.
                assert 3 == done.returncode, f"{command.page}: {command.line}\n{done.stderr}"
                assert "LeaseHeldError" in done.stderr, done.stderr[-2000:]
                continue
            assert 0 == done.returncode, f"{command.page}: {command.line}\n{done.stderr}"
            outputs[" ".join(args)] = done.stdout
        readyz = f"curl -s -w  %{{http_code}}\\n localhost:{port}/readyz"
        assert outputs[readyz].endswith(" 200\n"), outputs[readyz]
        metrics = outputs[f"curl -s localhost:{port}/metrics"]
        up = r'^lakehouse_ingest_query_up\{.*query="ingest_sensors".*\} 1\.0$'
        assert re.search(up, metrics, re.M), metrics[-2000:]
        # NoProgress's thread dump: SIGQUIT made the JVM print it to the container log.
        _wait_for(log, "JNI global refs", driver)  # the end of the dump
        assert '"stream execution thread for ingest_sensors' in log.read_text(errors="replace")

        # What a container runtime does on stop: SIGTERM to the entrypoint's PID 1, tini.
        os.kill(_tini_pid(driver.pid), signal.SIGTERM)
        assert 0 == driver.wait(timeout=120), log.read_text(errors="replace")[-4000:]
    finally:
        _kill_container_processes(driver)
    text = log.read_text(errors="replace")
    assert [] == _events(text, level="error")
    assert 1 == len(_events(text, event="stopped")), text[-4000:]


def test_the_image_is_lean_and_keeps_no_build_tool_or_build_secret(
    container: Container,
) -> None:
    size = _tree_bytes(container.root)
    assert size < SIZE_LIMIT_BYTES, f"the image's files take {size / 1e9:.2f} GB"
    for tool in ("mvn", "javac", "gcc", "cc", "make", "pip", "pip3", "wget", "git"):
        found = container.run(["sh", "-c", f"command -v {tool} || true"])
        assert ("", 0) == (found.stdout.strip(), found.returncode), tool
    assert [] == list((container.root / "opt/venv/lib/python3.11/site-packages").glob("pip*"))
    secrets = container.root / "run/secrets"
    assert not secrets.exists() or [] == list(secrets.iterdir())
    # The build machine's own certificate authorities reached pip and Maven as build
    # secrets only: the image trusts none of them.
    bundle = "".join((container.root / "etc/ssl/certs/ca-certificates.crt").read_text().split())
    java = (container.root / "etc/ssl/certs/java/cacerts").read_bytes()
    for ca in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")):
        body = "".join(ca.read_text().split("-----")[2].split())
        assert body not in bundle, f"{ca.name} is in the image's CA bundle"
        assert base64.b64decode(body) not in java, f"{ca.name} is in the image's truststore"


def test_compose_and_the_chart_run_the_image_as_it_is(image_config: dict[str, Any]) -> None:
    user = image_config["User"]
    home = dict(item.split("=", 1) for item in image_config["Env"])["HOME"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    for name in ("ingest", "generator"):
        service = compose[name]
        assert "entrypoint" not in service, name
        assert service.get("user", user) == user, name
    ingest = compose["ingest"]
    assert "command" not in ingest, "compose runs the image's own command"
    writable = set(ingest["tmpfs"]) | {v.split(":")[1] for v in ingest["volumes"]}
    assert {"/tmp", home} == writable
    assert "8080/tcp" in image_config["ExposedPorts"]
    assert "8080:8080" in ingest["ports"]

    deployments = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in render(None, False)
        if d["kind"] == "Deployment"
    }
    assert {"driver", "toolbox"} == set(deployments)
    for component, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        context = {**pod["securityContext"], **container.get("securityContext", {})}
        assert user == f"{context['runAsUser']}:{context['runAsGroup']}", component
        mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert {"/tmp", home} == mounts, component
    driver = deployments["driver"]["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in driver, "the chart runs the image's own entrypoint"
    assert image_config["Cmd"] == driver["args"]
    assert 8080 in [p["containerPort"] for p in driver["ports"]]


def test_the_toolbox_pods_command_runs_in_the_image_and_stops_on_sigterm(
    container: Container, tmp_path: Path
) -> None:
    (toolbox,) = [
        d
        for d in render(None, False)
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "toolbox"
    ]
    (spec,) = toolbox["spec"]["template"]["spec"]["containers"]
    command = [*spec["command"], *spec["args"]]
    log = tmp_path / "toolbox.log"
    process = container.start(command, {}, log)
    try:
        time.sleep(3)
        assert process.poll() is None, log.read_text(errors="replace")
        # What the kubelet does on a rollout or a delete: SIGTERM to tini; sleep ends at once.
        started = time.monotonic()
        os.kill(_tini_pid(process.pid), signal.SIGTERM)
        code = process.wait(timeout=30)
        assert time.monotonic() - started < 10
        assert code in (143, -15), (code, log.read_text(errors="replace"))
    finally:
        _kill_container_processes(process)


def _kill_container_processes(run: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of ``buildah run``'s session (it started it in a session of its
    own): the container's processes too, which outlive ``buildah run`` and which tini puts
    in process groups of their own."""
    if run.poll() is None:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                number, rest = stat.read_text().split(" (", 1)
                if int(rest.rsplit(") ", 1)[1].split()[3]) == run.pid:
                    os.kill(int(number), signal.SIGKILL)
        run.wait(timeout=30)


def _tini_pid(ancestor: int) -> int:
    """The pid of the tini process that ``buildah run`` (pid ``ancestor``) started."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            number, rest = stat.read_text().split(" (", 1)
            parents[int(number)] = int(rest.rsplit(") ", 1)[1].split()[1])
    for pid in sorted(parents):
        parent = parents[pid]
        while parent not in (0, 1, ancestor):
            parent = parents.get(parent, 0)
        if parent == ancestor and Path(f"/proc/{pid}/comm").read_text().strip() == "tini":
            return pid
    raise AssertionError(f"no tini process under pid {ancestor}")


def _events(text: str, **match: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``text`` whose fields equal ``match``."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            parsed = json.loads(line)
            if isinstance(parsed, dict) and match.items() <= parsed.items():
                found.append(parsed)
    return found


def _tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root``, as ``du -sb`` counts them."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            total += (Path(directory) / name).lstat().st_size
    return total


def _wait_ready(port: int, driver: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert driver.poll() is None, log.read_text(errors="replace")[-4000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise AssertionError(log.read_text(errors="replace")[-4000:])


def _wait_for(
    log: Path, needle: str, driver: subprocess.Popen[bytes], event: str | None = None
) -> None:
    """Wait until ``needle`` is in the log (in a line of ``event`` if given)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        lines = [json.dumps(e) for e in _events(text, event=event)] if event else [text]
        if any(needle in line for line in lines):
            return
        assert driver.poll() is None, log.read_text(errors="replace")[-4000:]
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} not in the log:\n{log.read_text(errors='replace')[-4000:]}")
