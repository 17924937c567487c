"""A command sent during a retention sweep of 2,000 trees commits before the sweep's next tree.

The real writer process and the real retention sweep (``supervisor/retention.py``); only the
writer link is wrapped, to log every request retention sends to the writer and every reply, in
order. The writer answers each group after its commit on one pipe, in commit
order, so the order of the replies in the log is the commit order: the test asserts that
order, never a time.
"""

from __future__ import annotations

import asyncio

import pytest

from piworkflows.clock import SystemClock
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.supervisor.retention import SERVER, Retention
from piworkflows.supervisor.writer_child import WriterChild
from piworkflows.writer import invariants
from piworkflows.writer.db import connect
from stress.bench.trees import plant

pytestmark = pytest.mark.timeout(300)
TREES = 2_000
PROBE_AFTER = (1, 700, 1_400, 1_999)  # send a command once this many trees are deleted


class LoggedWriter:
    """The writer link, logging ``(event, kind, n)`` for each request n it sends and answers."""

    def __init__(self, writer: WriterChild) -> None:
        self.writer, self.log, self.trees = writer, [], 0
        self.tree_deleted = asyncio.Event()

    async def request(self, kind: str, body: dict):
        n = sum(1 for entry in self.log if entry[0] == "sent")
        self.log.append(("sent", kind, n))
        reply = await self.writer.request(kind, body)
        self.log.append(("answered", kind, n, reply))
        if kind == "state.retain" and reply.receipt and reply.receipt["deleted"] is not None:
            self.trees += 1
            self.tree_deleted.set()
        return reply


async def sweep_with_probes(paths: StatePaths) -> tuple[bool, list[tuple], list[int]]:
    settings = Settings()
    child = WriterChild(paths, settings, on_spawn=lambda identity: None)
    await child.start()
    writer = LoggedWriter(child)
    retention = Retention(writer, settings, SystemClock(), busy=lambda: False)  # no runner, no stop
    sweep = asyncio.create_task(retention._sweep())
    probes = []
    try:
        for at in PROBE_AFTER:
            while writer.trees < at:
                writer.tree_deleted.clear()
                await writer.tree_deleted.wait()
            probes.append(len(writer.log))  # the probe's "sent" entry goes here
            body = {"actor": SERVER, "canonical_path": f"/projects/probe-{at}"}
            assert (await writer.request("project.ensure", body)).outcome == "accepted"
        completed = await sweep
    finally:
        await child.stop()
    return completed, writer.log, probes


def test_a_command_sent_during_a_sweep_commits_before_the_next_tree(paths: StatePaths):
    plant(paths, TREES)
    completed, log, probes = asyncio.run(sweep_with_probes(paths))
    assert completed

    retains = [entry for entry in log if entry[0] == "answered" and entry[1] == "state.retain"]
    assert [entry[3].receipt["runs"] for entry in retains[:-1]] == [1] * TREES  # one tree per transaction
    assert retains[-1][3].receipt["deleted"] is None  # then: none left

    for at in probes:
        sent = log[at]
        assert sent[:2] == ("sent", "project.ensure")
        answered_at = next(i for i, entry in enumerate(log) if entry[0] == "answered" and entry[2] == sent[2])
        between = [entry for entry in log[at:answered_at] if entry[0] == "answered" and entry[1] == "state.retain"]
        assert len(between) <= 1  # only the tree already in the writer when the probe arrived
        sent_after = {entry[2] for entry in log[at:] if entry[0] == "sent" and entry[1] == "state.retain"}
        assert not [entry for entry in between if entry[2] in sent_after]  # no later tree went first

    conn = connect(paths, Settings())
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        projects = {row[0] for row in conn.execute("SELECT canonical_path FROM projects")}
        assert {f"/projects/probe-{at}" for at in PROBE_AFTER} <= projects
        assert invariants.integrity(conn) == [] and invariants.violations(conn, 0) == {}
    finally:
        conn.close()
