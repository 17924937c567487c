"""Projects and content-addressed values."""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.content import BlobPut, BlobPutPart, BlobRead, ProjectEnsure, ReceiptFind
from piworkflows.writer import records
from piworkflows.writer.contract import Handler, Result, Tx
from piworkflows.writer.uploads import Received

ANY_SERVER_ROLE = frozenset({"server", "client", "runner", "outbox", "channel", "operator", "maintenance"})


class EnsureProject(Handler[ProjectEnsure]):
    """One stable id per canonical project path; repeating it adopts the row."""

    model = ProjectEnsure
    actors = frozenset({"server", "client", "operator"})

    def execute(self, tx: Tx, cmd: ProjectEnsure) -> Result:
        project_id, created = records.ensure_project(tx.conn, cmd.canonical_path, tx.now)
        return Result(receipt={"projectId": project_id, "created": created})


class PutBlob(Handler[BlobPut]):
    """Store a verified value (e.g. an oversized runner result); repeats adopt."""

    model = BlobPut
    actors = ANY_SERVER_ROLE

    def execute(self, tx: Tx, cmd: BlobPut) -> Result:
        created = records.put_blob(tx.conn, cmd.blob, tx.now)
        return Result(receipt={"digest": cmd.blob.digest.hex(), "byteLength": len(cmd.blob.data), "created": created})


class PutBlobPart(Handler[BlobPutPart]):
    """One part of an upload (writer/uploads.py): a value stored already is adopted at once; the
    value that this part completed, verified while it was decoded, is stored like blob.put stores it."""

    model = BlobPutPart
    actors = ANY_SERVER_ROLE

    def execute(self, tx: Tx, cmd: BlobPutPart) -> Result:
        received: Received = cmd._received
        part = cmd.part
        done = {"digest": part.digest.hex(), "byteLength": part.byte_length, "complete": True}
        stored = tx.conn.execute(
            "SELECT media_type, byte_length FROM blobs WHERE digest = ?", (part.digest,)
        ).fetchone()
        if stored is not None:
            if stored != (part.media_type, part.byte_length):
                raise CommandError("blobMismatch", "stored content under this digest differs", digest=part.digest.hex())
            received.forget()
            return Result(receipt={**done, "created": False})
        if received.refusal is not None:
            raise received.refusal
        if received.value is None:
            return Result(
                receipt={
                    "digest": part.digest.hex(),
                    "byteLength": part.byte_length,
                    "complete": False,
                    "receivedBytes": received.received_bytes,
                }
            )
        created = records.put_blob(tx.conn, received.value, tx.now)
        received.forget()
        return Result(receipt={**done, "created": created})


class ReadBlob(Handler[BlobRead]):
    """A bounded part of a stored value; the reader verifies the whole digest."""

    model = BlobRead
    actors = ANY_SERVER_ROLE
    read_only = True

    def execute(self, tx: Tx, cmd: BlobRead) -> Result:
        row = tx.conn.execute(
            "SELECT media_type, byte_length, substr(bytes, ?, ?) FROM blobs WHERE digest = ?",
            (cmd.offset + 1, cmd.limit, cmd.digest),
        ).fetchone()
        if row is None:
            raise CommandError("blobNotFound", "no stored value has this digest", digest=cmd.digest.hex())
        media_type, byte_length, part = row
        return Result(
            receipt={"mediaType": media_type, "byteLength": byte_length, "offset": cmd.offset, "data": bytes(part)}
        )


class FindReceipt(Handler[ReceiptFind]):
    """A stored client answer; a key reused for another request is a conflict."""

    model = ReceiptFind
    actors = frozenset({"server"})
    read_only = True

    def execute(self, tx: Tx, cmd: ReceiptFind) -> Result:
        stored = records.find_answer(tx.conn, cmd.key)
        if stored is None:
            return Result(receipt={"found": False})
        answer = {
            "outcome": stored.outcome,
            "revision": stored.revision,
            "receipt": stored.receipt,
            "error": stored.error,
        }
        return Result(receipt={"found": True, "answer": answer})


HANDLERS = (EnsureProject(), PutBlob(), PutBlobPart(), ReadBlob(), FindReceipt())
