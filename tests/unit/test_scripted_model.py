"""The scripted OpenAI-compatible model (piworkflows/testing/scripted_model.py) over real HTTP:
streamed and whole completions, tool calls, per-model scripts, recorded requests, and the errors
a test sees when a script has no step left."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from piworkflows.testing.scripted_model import ScriptedModel

pytestmark = pytest.mark.timeout(30)

SUBMIT = {"name": "workflow", "arguments": {"action": "submit", "output": {"answer": "forty-two", "note": "é ✓"}}}


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def events(data: bytes) -> list[Any]:
    """The server-sent events of a stream, ending with the literal [DONE]."""
    found = []
    for block in data.decode().split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            payload = block.removeprefix("data: ")
            found.append(payload if payload == "[DONE]" else json.loads(payload))
    return found


def test_a_streamed_answer_reassembles_its_text_and_tool_call_arguments():
    long_text = "The answer needs a few chunks to arrive: " * 3
    with ScriptedModel({"scripted-a": [{"text": long_text, "tool_calls": [SUBMIT]}]}) as model:
        body = {"model": "scripted-a", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
        status, data = post(model.url, body)
    assert status == 200
    *chunks, usage, done = events(data)
    assert done == "[DONE]" and usage["choices"] == [] and usage["usage"]["total_tokens"] > 0
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(delta.get("content", "") for delta in deltas) == long_text
    calls = [call for delta in deltas for call in delta.get("tool_calls", ())]
    assert calls[0]["id"] == "call_0" and calls[0]["function"]["name"] == "workflow"
    arguments = "".join(call["function"].get("arguments", "") for call in calls)
    assert json.loads(arguments) == SUBMIT["arguments"]
    assert len(calls) > 2  # the arguments came in pieces, as a real model streams them
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])


def test_each_model_id_follows_its_own_script_in_order_and_every_request_is_recorded():
    scripts = {"one": [{"text": "first"}, {"text": "second"}], "two": [{"text": "other"}]}
    with ScriptedModel(scripts) as model:
        answers = []
        for name in ("one", "two", "one"):
            status, data = post(model.url, {"model": name, "messages": [{"role": "user", "content": name}]})
            assert status == 200
            answer = json.loads(data)
            assert answer["object"] == "chat.completion" and answer["choices"][0]["finish_reason"] == "stop"
            answers.append(answer["choices"][0]["message"]["content"])
        with urllib.request.urlopen(model.url.removesuffix("/v1") + "/requests", timeout=10) as response:
            recorded = json.loads(response.read())
        with urllib.request.urlopen(model.url + "/models", timeout=10) as response:
            listed = [entry["id"] for entry in json.loads(response.read())["data"]]
    assert answers == ["first", "other", "second"]
    assert [request["messages"][0]["content"] for request in recorded] == ["one", "two", "one"]
    assert recorded == model.requests
    assert listed == ["one", "two"]


def test_a_whole_answer_with_a_tool_call_names_it_and_finishes_for_tools():
    with ScriptedModel({"m": [{"tool_calls": [SUBMIT]}]}) as model:
        status, data = post(model.url, {"model": "m", "messages": []})
    message = json.loads(data)["choices"][0]
    assert status == 200 and message["finish_reason"] == "tool_calls"
    (call,) = message["message"]["tool_calls"]
    assert call["function"]["name"] == "workflow" and json.loads(call["function"]["arguments"]) == SUBMIT["arguments"]


def test_a_stalled_step_answers_after_its_stall():
    with ScriptedModel({"slow": [{"stall_ms": 200, "text": "late"}]}) as model:
        began = time.monotonic()
        status, data = post(model.url, {"model": "slow", "messages": []})
        took = time.monotonic() - began
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "late"
    assert took >= 0.2


def test_no_script_or_no_step_left_is_a_400_that_names_the_model():
    with ScriptedModel({"short": [{"text": "only"}]}) as model:
        assert post(model.url, {"model": "short", "messages": []})[0] == 200
        status, data = post(model.url, {"model": "short", "messages": []})
        assert status == 400
        assert json.loads(data)["error"]["message"] == "the script of model 'short' has no step 2"
        status, data = post(model.url, {"model": "unknown", "messages": []})
        assert status == 400 and json.loads(data)["error"]["message"] == "no script for model 'unknown'"
        request = urllib.request.Request(
            model.url + "/chat/completions", b"[1, 2", {"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(request, timeout=10)
        assert bad.value.code == 400
        assert len(model.requests) == 3  # the malformed body is not a request


def test_a_cycling_script_starts_again_after_its_last_step():
    with ScriptedModel({"loop": [{"text": "one"}, {"text": "two"}]}, cycle=True) as model:
        answers = [
            json.loads(post(model.url, {"model": "loop", "messages": []})[1])["choices"][0]["message"]["content"]
            for _ in range(5)
        ]
    assert answers == ["one", "two", "one", "two", "one"]


def test_a_step_without_text_or_tool_calls_is_refused_when_the_script_is_given():
    with pytest.raises(ValueError, match="model 'm' step 2"):
        ScriptedModel({"m": [{"text": "fine"}, {"stall_ms": 10}]})


def test_request_id_in_a_step_becomes_the_one_the_latest_user_message_names():
    """The step contract's ``"requestId": "request-..."`` of the latest user message (content as a
    string or as text parts) replaces ``${requestId}`` in the text and in nested tool arguments."""
    contract = 'Complete this step ...:\n{"action": "submit", "requestId": "request-%s", "output": <your result>}'
    first, second = "request-" + "a" * 32, "request-" + "b" * 32
    submit = {
        "name": "workflow",
        "arguments": {"action": "submit", "requestId": "${requestId}", "output": {"ids": ["${requestId}", 1]}},
    }
    script = [
        {"text": "for ${requestId}", "tool_calls": [submit]},
        {"tool_calls": [submit]},
        {"text": "no ${requestId}"},
    ]
    with ScriptedModel({"m": script}) as model:
        messages = [
            {"role": "user", "content": contract % ("a" * 32)},
            {"role": "assistant", "content": "working"},
            {"role": "tool", "tool_call_id": "call_0", "content": "rejected"},
        ]
        status, data = post(model.url, {"model": "m", "messages": messages})
        answer = json.loads(data)["choices"][0]["message"]
        assert status == 200 and answer["content"] == f"for {first}"
        arguments = json.loads(answer["tool_calls"][0]["function"]["arguments"])
        assert arguments == {"action": "submit", "requestId": first, "output": {"ids": [first, 1]}}
        parts = [{"type": "text", "text": "Reminder"}, {"type": "text", "text": contract % ("b" * 32)}]
        body = {"model": "m", "messages": [*messages, {"role": "user", "content": parts}], "stream": True}
        status, data = post(model.url, body)
        calls = [call for chunk in events(data)[:-1] for call in chunk["choices"][0]["delta"].get("tool_calls", ())]
        assert json.loads("".join(call["function"].get("arguments", "") for call in calls))["requestId"] == second
        # The latest user message names no request: the step is answered as written.
        status, data = post(model.url, {"model": "m", "messages": [*messages, {"role": "user", "content": "hi"}]})
        assert json.loads(data)["choices"][0]["message"]["content"] == "no ${requestId}"
