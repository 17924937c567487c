"""Protocol outcomes and error codes: the one place that defines them.

A leaf module (stdlib only). Every refusal inside the server is a
``CommandError`` carrying an outcome from ``OUTCOMES`` and a camelCase code
from ``CODES``; it crosses process boundaries as ``{outcome, code, message,
details}`` (``to_wire``/``from_wire``) and becomes the protocol response's
``error`` sentence and ``receipt: {"code": ...}``. Messages are short safe
sentences: never tokens, payloads or stack traces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

Outcome = Literal["accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

# code -> the outcome it is always answered with
CODES: dict[str, Outcome] = {
    # conflict
    "staleRevision": "conflict",
    "idempotencyKeyReused": "conflict",
    "effectKeyConflict": "conflict",
    "winnerDecided": "conflict",
    "notWaiting": "conflict",
    "workflowSourceChanged": "conflict",
    "requestInFlight": "conflict",
    "leaseHeld": "conflict",
    "sessionReserved": "conflict",
    "runFinished": "conflict",
    "runPaused": "conflict",  # an agent step of a paused run takes no submission or turn
    "validationInProgress": "conflict",  # the request's submission is being validated
    "entryMismatch": "conflict",  # a step message already has another Pi entry
    "turnOpen": "conflict",  # another turn of the step is open
    # notFound
    "resourceNotFound": "notFound",
    "effectNotFound": "notFound",
    "blobNotFound": "notFound",
    "contentNotFound": "notFound",  # content the run does not own under this digest and media type
    "runNotFound": "notFound",
    "nothingDue": "notFound",
    "workflowNotFound": "notFound",
    "decisionNotFound": "notFound",
    "channelNotFound": "notFound",
    # claimLost
    "claimExpired": "claimLost",
    "claimTokenMismatch": "claimLost",
    "staleGeneration": "claimLost",
    "notClaimed": "claimLost",
    "staleServerEpoch": "claimLost",
    "staleCursor": "claimLost",  # channel.updates from another offset than the durable cursor
    # rejected
    "invalidTransition": "rejected",
    "wrongRequestKind": "rejected",  # an assistant-message step takes no workflow-tool submission
    "validationFailed": "rejected",
    "invalidRequest": "rejected",  # a value outside the protocol's value domain (protocol/domain.py): its path named
    "validatorFailed": "rejected",  # the validator of a submission timed out or broke: submit again
    "notAvailable": "rejected",
    "tooManyWatches": "rejected",  # a connection's live-view watches are bounded
    "actorNotAllowed": "rejected",
    "blobMismatch": "rejected",
    "uploadTooLarge": "rejected",  # a value larger than the writer ever holds in memory for an upload
    "constraintViolation": "rejected",
    "unknownCommand": "rejected",
    "resourceExists": "rejected",
    "invalidDefinition": "rejected",
    "presentationFailed": "rejected",
    "internalError": "rejected",
    "maxStepsExceeded": "rejected",
    "responseTooLarge": "rejected",
    "deletionBlocked": "rejected",  # run.delete: a blocker of prune's selection keeps the tree
    "databaseCorrupt": "rejected",  # a client must not retry it: every write is refused until an operator acts
    "modelAnswerRefused": "rejected",  # a model never answers a protected human decision
    "humanAnswerRequired": "rejected",  # a client that did not declare a human (or operator) source
    "humanDecisionProtected": "rejected",  # checkpoint.answer on a human decision: decision.answer answers it
    "channelConfigInvalid": "rejected",  # channels.json or its credentials do not validate (paths named)
    "configUnsafe": "rejected",  # the config directory or a file is not private to the user
    "channelBotChanged": "rejected",  # a profile's token names another bot than its cursor's
    "useChannelRecover": "rejected",  # effect.confirm/retry of a channel effect: channel.recover settles it
    # unavailable
    "unavailable": "unavailable",
    "writerRestarting": "unavailable",
    "shuttingDown": "unavailable",
    "diskFull": "unavailable",
    "ioError": "unavailable",
    "uploadsFull": "unavailable",  # the uploads in progress fill the writer's bound: the uploader tries again
}


def describe_invalid_fields(errors: Sequence[Mapping[str, Any]]) -> str:
    """Name the fields of a failed validation without echoing client input.

    ``errors`` is pydantic's ``ValidationError.errors()``. Known fields are
    named by their model path; an unexpected member is not named (its name is
    the sender's text).
    """
    names = set()
    for error in errors:
        if error.get("type") == "extra_forbidden":
            names.add("(unexpected member)")
        else:
            names.add(".".join(str(part) for part in error.get("loc", ())) or "(value)")
    return "invalid fields: " + ", ".join(sorted(names))


class CommandError(Exception):
    """A command that cannot be honoured; nothing it did remains."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.outcome = CODES[code]
        self.message = message
        self.details = details

    def receipt(self) -> dict[str, Any]:
        return {"code": self.code, **self.details}

    def to_wire(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "code": self.code, "message": self.message, "details": self.details}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> CommandError:
        return cls(wire["code"], wire["message"], **wire.get("details", {}))


class StateIncompatible(Exception):
    """The state database is not one this build can open; it was not changed."""

    MESSAGE = (
        "Pi Workflows durable state is incompatible. Back up and move state.sqlite with its -wal "
        "and -shm files, then start Pi Workflows to create a new state.sqlite database. The "
        "incompatible state was not changed."
    )
    # What follows MESSAGE where a user reads it (the CLI, a foreground server): the steps as one command.
    RESET_HINT = "With the server stopped, one command moves the three files into a new directory: {command}"

    def __init__(self, reason: str) -> None:
        super().__init__(self.MESSAGE)
        self.reason = reason  # for logs and tests; the user sees MESSAGE


class StateCorrupt(Exception):
    """The state database is damaged: the server refuses it (at start) or refuses every write (at
    run time). The message names the file and the ways back; nothing was changed."""

    def __init__(self, database: str, finding: str) -> None:
        finding = " ".join(finding.split())[:300]  # SQLite's report spans lines; the message is one
        super().__init__(
            f"Pi Workflows state database {database} is damaged ({finding}). It was not changed. "
            "Keep a copy of it, then either restore a verified backup (stop the server, "
            "'pi-workflows state verify BACKUP', 'pi-workflows state reset --backup /abs/new-dir/', "
            f"copy the backup to {database} with mode 0600) or move the damaged files aside "
            "('pi-workflows state reset --backup /abs/new-dir/') to start with a new database."
        )
        self.finding = finding  # for logs and tests


class StatePathRefused(Exception):
    """A path in the state directory the server must not use (a link, another owner, a wider mode,
    not a regular file, unreadable). The message names the path and the fix; nothing was changed."""
