"""Disk faults at the supervisor's own write sites: injected ENOSPC/EIO (PIW_FAULTS windows), host.json
replaced whole or not at all, and log lines that cannot be written counted instead of raised."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Iterator

import pytest

from piworkflows import faults
from piworkflows.paths import StatePaths, ensure_private_dir
from piworkflows.settings import Settings
from piworkflows.supervisor import logs
from piworkflows.supervisor.registry import Identity, Registry


@pytest.fixture(autouse=True)
def no_faults() -> Iterator[None]:
    yield
    faults.configure("")


def test_a_fault_window_fires_on_those_hits_only() -> None:
    faults.configure("supervisor.registry_save=enospc@2-3,supervisor.log_write=eio")
    faults.hit(faults.SUPERVISOR_REGISTRY_SAVE)
    for _ in range(2):
        with pytest.raises(OSError) as info:
            faults.hit(faults.SUPERVISOR_REGISTRY_SAVE)
        assert info.value.errno == errno.ENOSPC
    faults.hit(faults.SUPERVISOR_REGISTRY_SAVE)
    with pytest.raises(OSError) as info:
        faults.hit(faults.SUPERVISOR_LOG_WRITE)  # no window: every hit
    assert info.value.errno == errno.EIO


@pytest.mark.parametrize("spec", ["writer.before_commit=full", "writer.before_commit=enospc:5", "nowhere=eio"])
def test_a_bad_fault_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        faults.parse(spec)


def test_a_failed_host_json_write_leaves_the_previous_file_and_no_temp_file(paths: StatePaths) -> None:
    ensure_private_dir(paths.host_dir)
    first = Registry(serverEpoch=1, supervisor=Identity("supervisor", 10, 1.0, ""))
    first.save(paths.registry)
    before = paths.registry.read_bytes()
    faults.configure("supervisor.registry_save=enospc")
    with pytest.raises(OSError):
        Registry(serverEpoch=2, supervisor=Identity("supervisor", 11, 2.0, "")).save(paths.registry)
    assert paths.registry.read_bytes() == before and json.loads(before)["serverEpoch"] == 1
    assert sorted(p.name for p in paths.host_dir.iterdir()) == ["host.json"]


def test_log_lines_that_cannot_be_written_are_counted_and_reported_once_writing_works(paths: StatePaths) -> None:
    ensure_private_dir(paths.host_dir)
    logs.configure(paths, Settings(), to_stderr=False)
    log = logging.getLogger("piworkflows.test")
    try:
        faults.configure("supervisor.log_write=enospc@2-3")
        for n in range(1, 5):
            log.info("line %d", n)
    finally:
        for handler in logging.getLogger("piworkflows").handlers:
            handler.close()
    text = paths.log.read_text()
    assert "line 1" in text and "line 2" not in text and "line 3" not in text
    lost = text.index("2 log lines were lost (No space left on device)")
    assert lost < text.index("line 4")
