"""The run view over the socket: ``view.run.get`` (upstream's name of ``run.status``), and
``view.content``, which reads a reference's content back in verified base64 chunks."""

from __future__ import annotations

import hashlib
import json

import pytest

from piworkflows import canonical
from tests.engine_util import start, view, wait_status, write
from tests.server_util import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

# A node whose output is large (a reference in a step) and a final output larger than a state
# value's bound (a reference in the state too).
LARGE = """
from piworkflows.workflows import compute, define_workflow, edge
workflow = define_workflow("large", "make", {
    "make": compute(lambda ctx: {"text": "x" * ctx.input["n"]}),
    "small": compute(lambda ctx: {"length": len(ctx.outputs["make"]["text"])}),
    "last": compute(lambda ctx: {"echo": ctx.outputs["make"]["text"], "marker": {"$artifact": "mine"}}),
}, [edge("make", "small"), edge("small", "last")])
"""


def test_view_run_get_and_view_content_over_the_socket(server, project):
    write(project, "large", LARGE)
    run_id = start(server, project, "large", {"n": 300_000})
    other = start(server, project, "large", {"n": 10})
    wait_status(server, other, "completed")
    wait_status(server, run_id, "completed", "failed")
    wait_until(lambda: view(server, run_id)["queue"]["status"] == "done", what="the queue settled")  # no more changes
    with server.client() as client:
        got = client.request("view.run.get", {}, run_id=run_id)
        status = client.request("run.status", {}, run_id=run_id)
        assert got.outcome == status.outcome == "accepted" and got.receipt == status.receipt
        run = got.receipt
        assert run["display"]["status"] == "completed" and run["stepTotal"] == 3
        make, small, last = run["state"]["steps"]
        assert small["output"] == {"length": 300_000}  # small: inline
        assert set(make["output"]) == {"$artifact"} and make["output"]["$artifact"]["runId"] == run_id
        final = run["state"]["finalOutput"]
        assert final["$artifact"]["bytes"] > 300_000
        value = canonical.loads(client.read_content(run_id, final))  # chunked, verified
        assert value == {"echo": "x" * 300_000, "marker": {"$artifact": "mine"}}
        assert canonical.loads(client.read_content(run_id, make["output"])) == {"text": "x" * 300_000}
        path = final["$artifact"]["path"]
        chunk = client.request("view.content", {"path": path, "offset": 0}, run_id=run_id).receipt
        assert chunk["schema"] == "pi-workflows.content-chunk.v1" and chunk["complete"] is False
        assert (
            chunk["sha256"]
            == final["$artifact"]["sha256"]
            == hashlib.sha256(canonical.dumps(value).encode()).hexdigest()
        )
        refused = client.request("view.content", {"path": path}, run_id=other)  # another run's value
        assert (refused.outcome, refused.receipt["code"]) == ("notFound", "contentNotFound")
        unknown = client.request("view.run.get", {}, run_id="run-unknown")
        assert (unknown.outcome, unknown.receipt["code"]) == ("notFound", "runNotFound")
        bad = client.request("view.content", {"path": path, "offset": -1}, run_id=run_id)
        assert (bad.outcome, bad.receipt["code"]) == ("rejected", "validationFailed")
        assert client.request("view.run.get", {}, run_id=run_id).outcome == "accepted"  # the connection stays


def test_run_status_reads_back_references_it_can_show(server, project):
    """The CLI's story shows a value carried as a reference (up to 64 KiB) as the value itself."""
    write(project, "large", LARGE)
    run_id = start(server, project, "large", {"n": 2_000})
    wait_status(server, run_id, "completed")
    shown = server.cli("run", "status", run_id).stdout
    assert '"text":"xxxx' in shown and "bytes, too large" not in shown  # the step's output, read back
    assert '{"$artifact":"mine"}' in shown  # a user value shaped like a reference, as the user wrote it
    as_json = server.cli("run", "status", run_id, "--json").stdout
    assert json.loads(as_json)["state"]["steps"][0]["output"]["$artifact"]["bytes"] > 2_000  # as sent


def test_a_deleted_runs_content_is_not_found(server, project):
    write(project, "large", LARGE)
    run_id = start(server, project, "large", {"n": 1_000})
    wait_status(server, run_id, "completed")
    wait_until(lambda: view(server, run_id)["queue"]["status"] == "done", what="the queue settled")
    reference = view(server, run_id)["state"]["steps"][0]["output"]
    with server.client() as client:
        assert client.read_content(run_id, reference)  # readable while the run exists
        assert client.request("run.delete", {}, run_id=run_id).outcome == "accepted"
        gone = client.request("view.content", {"path": reference["$artifact"]["path"]}, run_id=run_id)
        assert (gone.outcome, gone.receipt["code"]) == ("notFound", "contentNotFound")


def test_view_page_over_the_socket_checks_the_revision_it_is_given(server, project):
    write(project, "large", LARGE)
    run_id = start(server, project, "large", {"n": 10})
    wait_status(server, run_id, "completed")
    wait_until(lambda: view(server, run_id)["queue"]["status"] == "done", what="the queue settled")
    revision = view(server, run_id)["revision"]
    with server.client() as client:
        page = client.request("view.page", {"kind": "steps", "limit": 2}, run_id=run_id)
        assert page.outcome == "accepted" and [s["nodeId"] for s in page.receipt["items"]] == ["make", "small"]
        assert (page.receipt["cursor"], page.receipt["total"], page.receipt["revision"]) == (2, 3, revision)
        same = client.request("view.page", {"kind": "trace"}, run_id=run_id, expected_revision=revision)
        assert same.outcome == "accepted" and same.receipt["total"] == view(server, run_id)["runRevision"]
        stale = client.request("view.page", {"kind": "steps"}, run_id=run_id, expected_revision=revision - 1)
        assert (stale.outcome, stale.receipt["code"]) == ("conflict", "staleRevision")
        assert stale.receipt["page"]["revision"] == revision  # the current page, to start over from
        bad = client.request("view.page", {"kind": "nothing"}, run_id=run_id)
        assert (bad.outcome, bad.receipt["code"]) == ("rejected", "validationFailed")
