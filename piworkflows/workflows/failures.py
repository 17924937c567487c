"""What went wrong when a workflow module loaded, told so that its author can act on it.

::

    discovery.compiled(source) raises ── describe(exc, source) ──> LoadFailure(file, line, message, text)

``text`` (what run.start, workflow.list and workflow.show answer) starts with
the file and line, then shows, for

- a SyntaxError: the offending line and a caret under the column;
- an ImportError: the module that could not be imported;
- any other exception (a WorkflowDefinitionError, whose message names the node,
  too): the last frames inside the workflow file (file, line, function, source
  line), never frames of piworkflows or of other modules.

Source lines come from the exact bytes that were executed, not the file as it
is now. ``text`` is at most ``MAX_TEXT`` characters, ``message`` one line.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from piworkflows.workflows.compiler import WorkflowDefinitionError
from piworkflows.workflows.discovery import ResolvedSource

MAX_TEXT = 4000
MAX_MESSAGE = 500
FRAMES = 5


@dataclass(frozen=True)
class LoadFailure:
    file: str
    line: int | None
    message: str  # one line: the exception and what it says
    text: str  # the report: "file, line N: message" and the detail below it


def describe(exc: BaseException, source: ResolvedSource, max_text: int = MAX_TEXT) -> LoadFailure:
    """The report of ``exc``, raised while ``source`` was executed, compiled or called; its
    ``text`` at most ``max_text`` characters."""
    lines = source.data.decode("utf-8", "replace").splitlines()
    if isinstance(exc, SyntaxError):
        return _syntax_error(exc, str(source.path), max_text)
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(source.path)]
    # A definition error's message is a sentence naming the node, edge or mount at fault.
    said = _said(exc) if isinstance(exc, WorkflowDefinitionError) else f"{type(exc).__name__}: {_said(exc)}"
    message = _first_line(said)
    if not frames:  # raised before or after the module ran (e.g. it defines no workflow): the message names the file
        return LoadFailure(str(source.path), None, message, _bounded(message, max_text))
    line = frames[-1].lineno
    detail = []
    if isinstance(exc, ImportError) and exc.name:
        detail.append(f"  the missing module: {exc.name}")
    detail.append("  in the workflow file (most recent call last):")
    for frame in frames[-FRAMES:]:
        detail.append(f'    File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.lineno is not None and 0 < frame.lineno <= len(lines):
            detail.append(f"      {lines[frame.lineno - 1].strip()}")
    report = "\n".join([f"{source.path}, line {line}: {message}", *detail])
    return LoadFailure(str(source.path), line, message, _bounded(report, max_text))


def _syntax_error(exc: SyntaxError, default_file: str, max_text: int) -> LoadFailure:
    file, line = exc.filename or default_file, exc.lineno
    message = _first_line(f"{type(exc).__name__}: {exc.msg}")
    report = [f"{file}, line {line}: {message}" if line else f"{file}: {message}"]
    if exc.text:
        code = exc.text.rstrip("\r\n")
        indent = len(code) - len(code.lstrip())
        report.append(f"    {code.strip()}")
        if exc.offset:
            end = exc.end_offset if exc.end_lineno == line and exc.end_offset else 0
            report.append("    " + " " * max(0, exc.offset - 1 - indent) + "^" * max(1, end - exc.offset))
    return LoadFailure(file, line, message, _bounded("\n".join(report), max_text))


def _said(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # workflow code's own exception class may fail to print
        return "(its message cannot be printed)"


def _first_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    return first if len(first) <= MAX_MESSAGE else first[: MAX_MESSAGE - 1] + "…"


def _bounded(text: str, max_text: int) -> str:
    return text if len(text) <= max_text else text[: max_text - 1] + "…"
