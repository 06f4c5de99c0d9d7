"""The SQLite ticket store: tickets, comments, idempotency keys, the request log, and their JSON."""

import hashlib
import json
import re
import sqlite3
import threading
import time
from contextlib import contextmanager


class ValidationFailed(Exception):
    """The request is well-formed JSON but not a valid ticket: Zendesk answers 422 RecordInvalid."""

    def __init__(self, details: dict):
        super().__init__("record invalid")
        self.details = details


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    external_id TEXT,
    subject TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'new',
    requester TEXT NOT NULL DEFAULT '{}',
    tags TEXT NOT NULL DEFAULT '[]',
    custom_fields TEXT NOT NULL DEFAULT '[]',
    fields TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    created_epoch REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tickets_external_id ON tickets (external_id);
CREATE TABLE IF NOT EXISTS comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    body TEXT NOT NULL,
    public INTEGER NOT NULL,
    author_id INTEGER,
    author TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS comments_ticket ON comments (ticket_id);
CREATE TABLE IF NOT EXISTS uploads (
    token TEXT PRIMARY KEY,
    filename TEXT NOT NULL,
    content_type TEXT NOT NULL DEFAULT 'application/octet-stream',
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    inline INTEGER NOT NULL DEFAULT 0,
    created_epoch REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    comment_id INTEGER,
    filename TEXT NOT NULL,
    content_type TEXT NOT NULL DEFAULT 'application/octet-stream',
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    inline INTEGER NOT NULL DEFAULT 0,
    marker TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS attachments_ticket ON attachments (ticket_id);
CREATE TABLE IF NOT EXISTS people (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    role TEXT NOT NULL DEFAULT 'end-user',
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ticket_people (
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    email TEXT NOT NULL,
    role TEXT NOT NULL,
    PRIMARY KEY (ticket_id, email, role)
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    status INTEGER NOT NULL,
    response TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    idempotency_key TEXT,
    external_id TEXT,
    fault TEXT,
    committed INTEGER NOT NULL,
    status INTEGER,
    idempotency_lookup TEXT,
    ticket_id INTEGER
);
"""

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class TicketStore:
    """Tickets, comments, idempotency keys and the request log in one SQLite database.

    One connection is shared by every handler thread behind one lock: a fake
    needs simple, obviously serial behaviour more than throughput. Callers wrap
    each unit of work in `transaction()`, so a ticket and the idempotency key
    that remembers it are committed together or not at all.
    """

    def __init__(self, path: str | None = None):
        # The desk's clock (epoch seconds): what records are stamped with and the search lag and key retention
        # compare against. `Desk.advance_clock` moves it, so a test waits for the index without sleeping.
        self.clock = time.time
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path or ":memory:", check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.executescript(_SCHEMA)

    @contextmanager
    def transaction(self):
        with self._lock, self._db:
            yield

    def close(self):
        with self._lock:
            self._db.close()

    def reset(self):
        # Ids start again from 1, as on a fresh desk.
        self._db.execute("DELETE FROM comments")
        for table in ("uploads", "attachments", "people", "ticket_people"):
            self._db.execute(f"DELETE FROM {table}")
        self._db.execute("DELETE FROM tickets")
        self._db.execute("DELETE FROM idempotency_keys")
        self._db.execute("DELETE FROM requests")
        self._db.execute("DELETE FROM sqlite_sequence")

    # Tickets and comments.

    def create_ticket(self, ticket: dict, fields: dict | None = None) -> int:
        """Insert a ticket. `fields`: the record as another dialect received it (kept as JSON, returned as is)."""
        comment = ticket.get("comment") if isinstance(ticket.get("comment"), dict) else {}
        body = comment.get("body") or ticket.get("description") or ""
        requester = ticket.get("requester") if isinstance(ticket.get("requester"), dict) else {}
        details = {}
        if not isinstance(body, str) or not body.strip():
            details["description"] = [{"description": "Description: cannot be blank", "error": "BlankValue"}]
        if "email" in requester and not _EMAIL.fullmatch(str(requester["email"])):
            details["requester"] = [{"description": "Requester email is invalid"}]
        if details:
            raise ValidationFailed(details)
        now = _now_iso()
        external_id = ticket.get("external_id")
        cursor = self._db.execute(
            "INSERT INTO tickets (external_id, subject, description, status, requester, tags, custom_fields,"
            " fields, created_at, updated_at, created_epoch) VALUES (?, ?, ?, 'new', ?, ?, ?, ?, ?, ?, ?)",
            (
                None if external_id is None else str(external_id),
                str(ticket.get("subject") or ""),
                body,
                json.dumps(requester),
                json.dumps(list(ticket.get("tags") or [])),
                json.dumps(list(ticket.get("custom_fields") or [])),
                json.dumps(fields or {}),
                now,
                now,
                self.clock(),
            ),
        )
        ticket_id = cursor.lastrowid
        # Zendesk keeps the description as the ticket's first comment.
        self._insert_comment(ticket_id, body, bool(comment.get("public", True)), comment.get("author_id"), {})
        return ticket_id

    def add_comment(self, ticket_id: int, ticket: dict) -> dict | None:
        """Apply a ticket update (a comment, maybe a status). None if there is no such ticket."""
        if self._ticket_row(ticket_id) is None:
            return None
        comment = ticket.get("comment")
        events = []
        if comment is not None:
            if not isinstance(comment, dict) or not isinstance(comment.get("body"), str) or not comment["body"].strip():
                raise ValidationFailed({"comment": [{"description": "Comment: body cannot be blank"}]})
            metadata = ticket.get("metadata") if isinstance(ticket.get("metadata"), dict) else {}
            comment_id = self._insert_comment(
                ticket_id, comment["body"], bool(comment.get("public", True)), comment.get("author_id"), metadata
            )
            events.append(
                {
                    "id": comment_id,
                    "type": "Comment",
                    "body": comment["body"],
                    "public": bool(comment.get("public", True)),
                    "author_id": comment.get("author_id"),
                }
            )
        if isinstance(ticket.get("status"), str):
            self._db.execute("UPDATE tickets SET status = ? WHERE id = ?", (ticket["status"], ticket_id))
        self._db.execute("UPDATE tickets SET updated_at = ? WHERE id = ?", (_now_iso(), ticket_id))
        return {
            "id": events[0]["id"] if events else None,
            "ticket_id": ticket_id,
            "created_at": _now_iso(),
            "events": events,
            "metadata": {"custom": ticket.get("metadata") or {}},
        }

    def update_fields(self, ticket_id: int, ticket: dict, fields: dict) -> None:
        """An upsert that found its record: subject, description and `fields` replaced, as the APIs do."""
        row = self._ticket_row(ticket_id)
        merged = {**json.loads(row["fields"]), **(fields or {})}
        self._db.execute(
            "UPDATE tickets SET subject = ?, description = ?, fields = ?, updated_at = ? WHERE id = ?",
            (
                str(ticket.get("subject") or row["subject"]),
                str(ticket.get("description") or row["description"]),
                json.dumps(merged),
                _now_iso(),
                ticket_id,
            ),
        )

    def _insert_comment(self, ticket_id, body, public, author_id, metadata, author: str = "") -> int:
        if not author and isinstance(author_id, int):
            found = self._db.execute("SELECT email FROM people WHERE id = ?", (author_id,)).fetchone()
            author = found["email"] if found else ""
        cursor = self._db.execute(
            "INSERT INTO comments (ticket_id, body, public, author_id, author, metadata, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                ticket_id,
                body,
                int(public),
                author_id if isinstance(author_id, int) else None,
                author or "",
                json.dumps(metadata),
                _now_iso(),
            ),
        )
        return cursor.lastrowid

    def insert_comment(
        self,
        ticket_id: int,
        body: str,
        *,
        public: bool = True,
        author: str = "",
        author_id: int | None = None,
        metadata: dict | None = None,
    ) -> int:
        """A comment as any dialect's API adds one: `author` the address (or desk user) it is written as."""
        comment_id = self._insert_comment(ticket_id, body, public, author_id, metadata or {}, author)
        self._db.execute("UPDATE tickets SET updated_at = ? WHERE id = ?", (_now_iso(), ticket_id))
        return comment_id

    # Files: uploads made before a write (tokens), and attachments on a record.

    def add_upload(self, token: str, filename: str, content_type: str, data: bytes, inline: bool = False) -> dict:
        self._db.execute(
            "INSERT INTO uploads (token, filename, content_type, size, sha256, inline, created_epoch)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (token, filename, content_type, len(data), hashlib.sha256(data).hexdigest(), int(inline), self.clock()),
        )
        return self.upload(token)

    def upload(self, token: str) -> dict | None:
        row = self._db.execute("SELECT * FROM uploads WHERE token = ?", (token,)).fetchone()
        return None if row is None else {**dict(row), "inline": bool(row["inline"])}

    def add_attachment(
        self,
        ticket_id: int,
        *,
        filename: str,
        content_type: str,
        size: int,
        sha256: str,
        inline: bool = False,
        comment_id: int | None = None,
        marker: str = "",
    ) -> int:
        cursor = self._db.execute(
            "INSERT INTO attachments (ticket_id, comment_id, filename, content_type, size, sha256, inline, marker,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (ticket_id, comment_id, filename, content_type, size, sha256, int(inline), marker, _now_iso()),
        )
        return cursor.lastrowid

    def attach_data(self, ticket_id: int, filename: str, content_type: str, data: bytes, **options) -> int:
        return self.add_attachment(
            ticket_id,
            filename=filename,
            content_type=content_type,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            **options,
        )

    def attachments(self, ticket_id: int) -> list[dict]:
        rows = self._db.execute("SELECT * FROM attachments WHERE ticket_id = ? ORDER BY id", (ticket_id,)).fetchall()
        return [{**dict(row), "inline": bool(row["inline"])} for row in rows]

    # People: the desk's users/customers/contacts, and who is on which ticket.

    def find_or_create_person(self, email: str, name: str = "", role: str = "end-user") -> tuple[int, bool]:
        """(id, created) of the person with `email` (case-insensitive)."""
        email = email.strip()
        row = self._db.execute("SELECT id FROM people WHERE lower(email) = lower(?)", (email,)).fetchone()
        if row is not None:
            return row["id"], False
        cursor = self._db.execute(
            "INSERT INTO people (email, name, role, created_at) VALUES (?, ?, ?, ?)",
            (email, name or email.split("@")[0], role, _now_iso()),
        )
        return cursor.lastrowid, True

    def person(self, person_id: int | None = None, email: str | None = None) -> dict | None:
        if person_id is not None:
            row = self._db.execute("SELECT * FROM people WHERE id = ?", (person_id,)).fetchone()
        else:
            row = self._db.execute("SELECT * FROM people WHERE lower(email) = lower(?)", (email or "",)).fetchone()
        return None if row is None else dict(row)

    def people(self) -> list[dict]:
        return [dict(row) for row in self._db.execute("SELECT * FROM people ORDER BY id").fetchall()]

    def add_ticket_person(self, ticket_id: int, email: str, role: str) -> None:
        """`role`: "requester" or "cc" (followers, participants, watchers: who the desk keeps informed)."""
        self._db.execute(
            "INSERT OR IGNORE INTO ticket_people (ticket_id, email, role) VALUES (?, ?, ?)",
            (ticket_id, email.strip().lower(), role),
        )

    def ticket_people(self, ticket_id: int) -> dict:
        rows = self._db.execute(
            "SELECT email, role FROM ticket_people WHERE ticket_id = ? ORDER BY rowid", (ticket_id,)
        ).fetchall()
        requester = next((row["email"] for row in rows if row["role"] == "requester"), "")
        return {"requester": requester, "cc": [row["email"] for row in rows if row["role"] == "cc"]}

    def set_status(self, ticket_id: int, status: str) -> None:
        self._db.execute("UPDATE tickets SET status = ?, updated_at = ? WHERE id = ?", (status, _now_iso(), ticket_id))

    def _ticket_row(self, ticket_id):
        return self._db.execute("SELECT * FROM tickets WHERE id = ?", (ticket_id,)).fetchone()

    def ticket(self, ticket_id: int, base_url: str) -> dict | None:
        row = self._ticket_row(ticket_id)
        return None if row is None else _ticket_json(row, base_url)

    def tickets(self, base_url: str, external_id: str | None = None) -> list[dict]:
        if external_id is None:
            rows = self._db.execute("SELECT * FROM tickets ORDER BY id").fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM tickets WHERE external_id = ? ORDER BY id", (external_id,)
            ).fetchall()
        return [_ticket_json(row, base_url) for row in rows]

    def search(self, base_url: str, external_id: str, lag_seconds: float) -> list[dict]:
        """What an eventually consistent search index finds: only tickets older than `lag_seconds`."""
        rows = self._db.execute(
            "SELECT * FROM tickets WHERE external_id = ? AND created_epoch <= ? ORDER BY id",
            (external_id, self.clock() - lag_seconds),
        ).fetchall()
        return [_ticket_json(row, base_url) for row in rows]

    def updated_since(self, base_url: str, since_iso: str, after_id: int, limit: int) -> list[dict]:
        """Tickets updated at or after `since_iso`, with an id above `after_id`, by id (the export's order here)."""
        rows = self._db.execute(
            "SELECT * FROM tickets WHERE updated_at >= ? AND id > ? ORDER BY id LIMIT ?", (since_iso, after_id, limit)
        ).fetchall()
        return [_ticket_json(row, base_url) for row in rows]

    def comments(self, ticket_id: int) -> list[dict]:
        rows = self._db.execute("SELECT * FROM comments WHERE ticket_id = ? ORDER BY id", (ticket_id,)).fetchall()
        return [
            {
                "id": row["id"],
                "type": "Comment",
                "body": row["body"],
                "public": bool(row["public"]),
                "author_id": row["author_id"],
                "author": row["author"],
                "metadata": {"custom": json.loads(row["metadata"])},
                "created_at": row["created_at"],
            }
            for row in rows
        ]

    # Idempotency keys.

    def recall(self, key: str, retention_seconds: float):
        """The stored (fingerprint, status, response) for a key still inside its retention, else None."""
        self._db.execute("DELETE FROM idempotency_keys WHERE created_at <= ?", (self.clock() - retention_seconds,))
        row = self._db.execute(
            "SELECT fingerprint, status, response FROM idempotency_keys WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else (row["fingerprint"], row["status"], json.loads(row["response"]))

    def remember(self, key: str, fingerprint: str, status: int, response: dict):
        self._db.execute(
            "INSERT OR REPLACE INTO idempotency_keys (key, fingerprint, status, response, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (key, fingerprint, status, json.dumps(response), self.clock()),
        )

    # The request log.

    def log_request(self, entry: dict):
        self._db.execute(
            "INSERT INTO requests (at, method, path, idempotency_key, external_id, fault, committed, status,"
            " idempotency_lookup, ticket_id) VALUES (:at, :method, :path, :idempotency_key, :external_id, :fault,"
            " :committed, :status, :idempotency_lookup, :ticket_id)",
            {**entry, "committed": int(bool(entry["committed"]))},
        )

    def requests(self) -> list[dict]:
        rows = self._db.execute("SELECT * FROM requests ORDER BY id").fetchall()
        return [{**dict(row), "committed": bool(row["committed"])} for row in rows]


def _ticket_json(row, base_url: str) -> dict:
    return {
        "id": row["id"],
        "url": f"{base_url}/api/v2/tickets/{row['id']}.json",
        "external_id": row["external_id"],
        "subject": row["subject"],
        "description": row["description"],
        "status": row["status"],
        "requester": json.loads(row["requester"]),
        "tags": json.loads(row["tags"]),
        "custom_fields": json.loads(row["custom_fields"]),
        "fields": json.loads(row["fields"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
