"""`make run`'s script answers --help, refuses an unknown option and seeds its generator, without
starting anything."""

import subprocess
import sys
from datetime import UTC, datetime

from run_local import Generator

from service.verbs.generate import RecordFactory
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
    assert "GENERATOR_SEED" in done.stdout
    assert "starting Kafka" not in done.stdout


def test_an_unknown_option_is_refused_with_exit_2() -> None:
    done = _run("--rate", "5")
    assert 2 == done.returncode
    assert "unrecognized arguments: --rate 5" in done.stderr


def test_each_run_seeds_the_generator_anew_unless_generator_seed_repeats_one() -> None:
    runs = [Generator.from_env({}, seed) for seed in (1, 2)]
    assert [["--seed", "1"], ["--seed", "2"]] == [g.args()[5:7] for g in runs]
    # Another seed, other event ids: a second run's readings are not the first one's again
    # (every one of them a duplicate within the dedup horizon).
    moment = datetime(2026, 11, 27, tzinfo=UTC)
    ids = {RecordFactory(500, int(g.seed)).reading(moment)[1]["event_id"] for g in runs}
    assert 2 == len(ids)
    pinned = Generator.from_env({"GENERATOR_SEED": "7", "GENERATOR_MIX": ""}, 1)
    assert ["generate", "--users", "500", "--rate", "200", "--seed", "7"] == pinned.args()
