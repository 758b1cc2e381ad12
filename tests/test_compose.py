"""The compose deployment (docker-compose.yml), started for real where a Docker engine answers.

Where none answers (this project's CI machines), the test is skipped and says so; the compose
file's settings are checked against the code on every run by
``tests/test_config.py::test_compose_passes_only_settings_the_code_reads``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def docker_answers() -> str | None:
    """None when a Docker engine with compose answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker command"
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, check=False, timeout=30)
    if probe.returncode != 0:
        return f"no Docker engine answers: {(probe.stderr or probe.stdout).strip()[:200]}"
    compose = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True,
                             check=False, timeout=30)
    return None if compose.returncode == 0 else "docker compose is not installed"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_compose_deployment_runs_a_task_over_tls() -> None:
    why = docker_answers()
    if why is not None:
        pytest.skip(f"compose smoke check not run: {why}")
    project = f"latchwork-smoke-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LATCHWORK_ZK_PASSWORD": uuid.uuid4().hex,
           "LATCHWORK_AMQP_PASSWORD": uuid.uuid4().hex}
    compose = ["docker", "compose", "-p", project, "-f", str(ROOT / "docker-compose.yml")]

    def run(*args: str, timeout: float = 900) -> str:
        done = subprocess.run([*compose, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    try:
        run("up", "-d", "--build", "--wait")
        submitted = json.loads(run("exec", "-T", "node1", "latchwork", "task", "submit",
                                   "diag.sleep", "--payload", '{"seconds": 1}', "--json"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            shown = json.loads(run("exec", "-T", "node2", "latchwork", "task", "show",
                                   submitted["id"], "--json"))
            if shown["task"]["finished"]:
                break
            time.sleep(2)
        assert shown["task"]["finished"], shown
        status = json.loads(run("exec", "-T", "node3", "latchwork", "cluster", "status",
                                "--json"))
        assert len(status["members"]) == 3 and status["master"]
    finally:
        subprocess.run([*compose, "down", "-v"], env=env, capture_output=True, check=False,
                       timeout=600)
