"""`make run`'s script answers --help, and refuses an unknown option, without starting anything."""

import subprocess
import sys

from tests.support.repo import REPO

SCRIPT = REPO / "deploy" / "local" / "run_local.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO / "deploy" / "local")}
    return subprocess.run(  # a started stack would not return: the timeout fails the test
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_help_prints_what_make_run_starts_and_starts_nothing() -> None:
    done = _run("--help")
    assert 0 == done.returncode, done.stderr
    assert done.stdout.startswith("usage: make run")
    assert "GENERATOR_RATE" in done.stdout
    assert "starting Kafka" not in done.stdout


def test_an_unknown_option_is_refused_with_exit_2() -> None:
    done = _run("--rate", "5")
    assert 2 == done.returncode
    assert "unrecognized arguments: --rate 5" in done.stderr
