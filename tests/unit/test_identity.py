"""Process identity (supervisor/registry.py): a recorded pid is matched only with its create time,
its command-line marker and while it is no zombie, and nothing is signalled unless it matches.
Each test runs a real sleeping child of its own (killed at the end)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import psutil
import pytest

from piworkflows.supervisor.registry import Identity, end_process

pytestmark = pytest.mark.timeout(30)

MARKER = "piw-identity-test-child"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", MARKER])
    yield proc
    proc.kill()
    proc.wait()


def test_the_recorded_identity_finds_its_process(child):
    found = Identity.of("writer", child.pid, MARKER).find()
    assert found is not None and found.pid == child.pid


def test_another_create_time_is_another_process(child):
    recorded = Identity.of("writer", child.pid, MARKER)
    assert replace(recorded, createTime=recorded.createTime + 1.0).find() is None
    assert replace(recorded, createTime=recorded.createTime - 0.01).find() is None


def test_another_marker_is_another_process(child):
    assert Identity.of("writer", child.pid, "piworkflows.writer").find() is None


def test_a_zombie_is_gone(child):
    recorded = Identity.of("writer", child.pid, MARKER)
    child.kill()  # not reaped yet: the pid stays, as a zombie
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.01)
    assert recorded.find() is None


def test_end_process_signals_nothing_whose_create_time_differs(child):
    recorded = Identity.of("writer", child.pid, MARKER)
    assert end_process(replace(recorded, createTime=recorded.createTime + 1.0), grace_s=1.0) is False
    assert child.poll() is None and psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE
    assert end_process(recorded, grace_s=5.0) is True
    assert recorded.find() is None  # ended (psutil reaped it: the Popen handle learns nothing more)
