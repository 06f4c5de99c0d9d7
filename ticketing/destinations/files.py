"""Files to a desk exactly once, whatever an attempt loses.

Two ways, by kind (`Capabilities.files`):
- with the write: the files travel in the create or comment call (multipart), or are uploaded first and
  referenced by the write (a Zendesk upload token, a Jira temporary attachment id). Uploads made first are
  noted in the journal and reused by the next attempt while they are valid (`reuse_upload`), so a retried
  write sends the same body under its key and no upload is made twice within its validity.
- after the write: one call per file on the record, carried out by the `attach_files` intent
  (`ticketing.attachments`). `attach_each` marks each file `sent` in the journal before its call and `done`
  after it; a file found `sent` (an answer lost, a worker killed) is looked up on the record
  (`adapter.find_file`, by the file's own key where the desk keeps one) before it is sent again.
  A file the desk refuses for good (too large for its plan, a type it bans) is noted `refused` and the
  others go on: the audit row of the `attach_files` intent names it.
"""

import logging
import time

from .base import AmbiguousOutcome, OutgoingFile, PermanentError, TransientError

log = logging.getLogger(__name__)

SENT, DONE, REFUSED = "sent", "done", "refused"


def file_step(file: OutgoingFile) -> str:
    return f"file:{file.index}"


def attach_each(adapter, ticket_id: str, files, idempotency_key: str, *, public: bool = True) -> dict[str, list]:
    """Attach every file of `files` to `ticket_id` once; {"done": [desk ids], "refused": [filenames]}.
    Raises TransientError to try again later (what is done stays done)."""
    journal = adapter.journal
    done, refused = [], []
    for file in files:
        step = file_step(file)
        noted = journal.get(step) or {}
        file_key = file.key(idempotency_key)
        if noted.get("state") == DONE:
            done.append(noted.get("id"))
            continue
        if noted.get("state") == REFUSED:
            refused.append(file.filename)
            continue
        if noted.get("state") == SENT:
            try:
                found = adapter.find_file(ticket_id, file, file_key)
            except (AmbiguousOutcome, PermanentError) as exc:
                raise TransientError(exc.reason, f"{file.filename}: looking for an earlier upload failed") from exc
            if found:
                journal.put(step, {"state": DONE, "id": str(found)})
                done.append(str(found))
                continue
        journal.put(step, {"state": SENT, "at": time.time()})
        try:
            desk_id = adapter.upload_file(ticket_id, file, file_key, public=public)
        except AmbiguousOutcome as exc:
            # Marked sent: the next attempt looks on the record before sending it again.
            raise TransientError(exc.reason, f"{file.filename}: {exc.detail}", retry_after=None) from exc
        except PermanentError as exc:
            if getattr(exc, "http_status", None) in (401, 403) or exc.reason in ("credentials", "configuration"):
                raise
            log.warning("%s: file %s refused for good (%s)", adapter.destination.kind, file.index, exc.reason)
            journal.put(step, {"state": REFUSED, "reason": str(exc.reason)})
            refused.append(file.filename)
            continue
        journal.put(step, {"state": DONE, "id": str(desk_id)})
        done.append(str(desk_id))
    return {"done": done, "refused": refused}


def reuse_upload(adapter, file: OutgoingFile, upload, *, valid_seconds: float) -> dict:
    """The upload made for `file` by an earlier attempt while it is still valid, else `upload(file)`'s answer
    (a dict: the desk's token or id and whatever the write needs), noted for the next attempt."""
    step = f"upload:{file.index}"
    noted = adapter.journal.get(step) or {}
    if noted.get("value") is not None and time.time() - float(noted.get("at", 0)) < valid_seconds:
        return noted["value"]
    value = upload(file)
    adapter.journal.put(step, {"value": value, "at": time.time()})
    return value
