"""Shared by the agl_rl tests: the extras switch and an `agl store` fixture.

AGL_RL_REQUIRE_EXTRAS=1 (set by scripts/ci/python_wheel.sh) makes a missing optional package
(agentlightning, gymnasium) or a missing AGL_BIN a failure instead of a skip."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

REQUIRE_EXTRAS = os.environ.get("AGL_RL_REQUIRE_EXTRAS") == "1"


def extra(name: str):
    """Imports the optional package `name`, or skips (fails with AGL_RL_REQUIRE_EXTRAS=1)."""
    if REQUIRE_EXTRAS:
        return __import__(name)
    return pytest.importorskip(name)


@pytest.fixture()
def agl_store(tmp_path):
    """The URL of a fresh in-memory `agl store` ($AGL_BIN), stopped after the test."""
    binary = os.environ.get("AGL_BIN")
    if not binary:
        if REQUIRE_EXTRAS:
            pytest.fail("AGL_BIN is not set")
        pytest.skip("AGL_BIN is not set")
    log = open(tmp_path / "store.log", "w+")
    proc = subprocess.Popen([binary, "store", "--port", "0"], stdout=log, stderr=subprocess.STDOUT)
    url = None
    deadline = time.time() + 60
    while time.time() < deadline and url is None and proc.poll() is None:
        log.seek(0)
        m = re.search(r"listening on (http://[0-9.:]+)", log.read())
        url = m.group(1) if m else None
        if url is None:
            time.sleep(0.1)
    if url is None:
        proc.kill()
        log.seek(0)
        pytest.fail(f"agl store did not start: {log.read()}")
    yield url
    proc.terminate()
    proc.wait(10)
    log.close()
