"""The embedded broker: kombu's SQLAlchemy transport on a SQLite file, safe for several processes.

The embedded default (`make run`) has no Redis: the relay, beat, the web and the worker's children publish,
and the worker consumes, through one SQLite file under `var/` (settings: `CELERY_BROKER_URL=sqlite:///...`,
`CELERY_BROKER_TRANSPORT="config.broker:Transport"`). Kombu's file-system transport lost its footing under
that load (a reader could take a message file before its writer had filled it: celery/kombu#1551, a
JSONDecodeError that stopped the worker). Kombu's SQLAlchemy channel keeps its tables and its place in
kombu's machinery here, with these changes:

- each operation is one autocommit statement: a delivery is `DELETE ... RETURNING` of the queue's oldest row,
  so two consumers never get one message and no transaction ever upgrades a read lock (SQLITE_BUSY);
  an idle poll is a read and takes no write lock; every connection waits `busy_timeout` for the lock, in WAL;
- a delivered row is deleted (the stock channel keeps every row, `visible=0`, forever): a message handed
  to a worker lives in the worker's memory until acked, as it did before; a worker killed with messages
  in hand loses them, and the database sweeps (stale events, due intents) redo their work;
- a row that cannot be decoded (not JSON, no envelope, a body that is not accepted JSON) is logged as a
  WARNING, without its body, and dropped: never an exception out of the worker's event loop;
- engines are per process (forked pool children never reuse their parent's SQLite connections);
- a consumer whose prefetch is full looks again within milliseconds, not a polling interval (Transport).

`bench/broker_embedded.py` measures it: lost, duplicated and crashed under several producers and workers.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import UTC, datetime
from queue import Empty
from time import monotonic, sleep

from kombu.exceptions import ContentDisallowed, DecodeError
from kombu.serialization import loads, prepare_accept_content
from kombu.transport import sqlalchemy as kombu_sqlalchemy
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import sessionmaker

logger = logging.getLogger(__name__)

# How long a statement waits for another process's write lock before "database is locked".
BUSY_TIMEOUT_SECONDS = 30.0
# A run of undecodable rows is dropped within one poll, up to this many.
MAX_DROPS_PER_POLL = 100
# How soon a consumer whose prefetch is full looks again (no query: it checks its own acks).
PREFETCH_WAIT_SECONDS = 0.005

_ENGINES: dict[tuple[int, str], tuple] = {}
_ENGINES_LOCK = threading.Lock()


class UndecodableMessage(ValueError):
    """A stored message that no consumer could use; the text names what is wrong, never the content."""


def _configure_connection(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")  # readers beside the writer
        cursor.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; a crash of the OS may lose the last
    finally:
        cursor.close()


def decode_payload(raw, *, decode_body, accept) -> dict:
    """The stored row as kombu's envelope, checked so far as the consumer will use it; UndecodableMessage if not."""
    try:
        payload = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise UndecodableMessage(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise UndecodableMessage("not an envelope")
    properties = payload.get("properties")
    if not isinstance(properties, dict) or "delivery_tag" not in properties:
        raise UndecodableMessage("no properties with a delivery tag")
    if not isinstance(properties.get("delivery_info", {}), dict) or not isinstance(payload.get("headers", {}), dict):
        raise UndecodableMessage("delivery info or headers are not mappings")
    body = payload.get("body")
    if body:
        try:
            data = decode_body(body, properties.get("body_encoding"))
            loads(data, payload.get("content-type"), payload.get("content-encoding"), accept=accept)
        except (ContentDisallowed, DecodeError) as exc:
            raise UndecodableMessage(f"body not accepted ({type(exc).__name__})") from None
        except Exception as exc:  # a bad base64 or charset: whatever the codec raises
            raise UndecodableMessage(f"body not decodable ({type(exc).__name__})") from None
    return payload


class Channel(kombu_sqlalchemy.Channel):
    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self._queue_ids: dict[str, int] = {}
        options = connection.client.transport_options
        self._accept = prepare_accept_content(options.get("accept_content") or ["json"])
        self._open()  # the file and its tables now: an unreachable broker fails the connection, not a later poll

    # --- the engine -----------------------------------------------------------------------------
    def _engine_from_config(self):
        engine = create_engine(
            self.connection.client.hostname,
            isolation_level="AUTOCOMMIT",
            connect_args={"timeout": BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
        )
        event.listen(engine, "connect", _configure_connection)
        return engine

    def _open(self):
        key = (os.getpid(), self.connection.client.hostname)
        with _ENGINES_LOCK:
            if key not in _ENGINES:
                engine = self._engine_from_config()
                try:
                    kombu_sqlalchemy.metadata.create_all(engine)
                except OperationalError:  # another process created the tables between the check and the CREATE
                    kombu_sqlalchemy.metadata.create_all(engine)
                _ENGINES[key] = engine, sessionmaker(bind=engine)
            return _ENGINES[key]

    @property
    def _engine(self):
        return self._open()[0]

    # --- the statements ----------------------------------------------------------------------------
    def _queue_id(self, queue: str) -> int:
        queue_id = self._queue_ids.get(queue)
        if queue_id is None:
            table = self.queue_cls.__tablename__
            with self._engine.connect() as conn:
                conn.execute(text(f"INSERT OR IGNORE INTO {table} (name) VALUES (:name)"), {"name": queue})
                queue_id = conn.execute(
                    text(f"SELECT id FROM {table} WHERE name = :name"), {"name": queue}
                ).scalar_one()
            self._queue_ids[queue] = queue_id
        return queue_id

    def _new_queue(self, queue, **kwargs):
        self._queue_id(queue)

    def _put(self, queue, payload, **kwargs):
        queue_id = self._queue_id(queue)
        with self._engine.connect() as conn:
            conn.execute(
                text(
                    f"INSERT INTO {self.message_cls.__tablename__} (visible, timestamp, payload, version, "
                    "queue_id) VALUES (1, :at, :payload, 1, :queue_id)"
                ),
                {
                    "at": datetime.now(UTC).replace(tzinfo=None).isoformat(" "),
                    "payload": json.dumps(payload),
                    "queue_id": queue_id,
                },
            )

    def _take(self, queue_id: int):
        """The queue's oldest message, removed in the same statement (id, payload), or None."""
        table = self.message_cls.__tablename__
        with self._engine.connect() as conn:
            # A read first: an idle poll takes no write lock.
            if (
                conn.execute(
                    text(f"SELECT 1 FROM {table} WHERE queue_id = :q AND visible = 1 LIMIT 1"), {"q": queue_id}
                ).first()
                is None
            ):
                return None
            return conn.execute(
                text(
                    f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} WHERE queue_id = :q AND visible = 1 "
                    "ORDER BY id LIMIT 1) RETURNING id, payload"
                ),
                {"q": queue_id},
            ).first()

    def _get(self, queue):
        queue_id = self._queue_id(queue)
        for _ in range(MAX_DROPS_PER_POLL):
            row = self._take(queue_id)
            if row is None:
                raise Empty()
            try:
                return decode_payload(row.payload, decode_body=self.decode_body, accept=self._accept)
            except UndecodableMessage as exc:
                logger.warning(
                    "embedded broker: dropped message %s of queue %s: %s (the database sweeps redo its work)",
                    row.id,
                    queue,
                    exc,
                )
        raise Empty()

    def _size(self, queue):
        with self._engine.connect() as conn:
            return conn.execute(
                text(f"SELECT COUNT(*) FROM {self.message_cls.__tablename__} WHERE queue_id = :q AND visible = 1"),
                {"q": self._queue_id(queue)},
            ).scalar_one()

    def _purge(self, queue):
        with self._engine.connect() as conn:
            return conn.execute(
                text(f"DELETE FROM {self.message_cls.__tablename__} WHERE queue_id = :q"), {"q": self._queue_id(queue)}
            ).rowcount


class Transport(kombu_sqlalchemy.Transport):
    Channel = Channel
    driver_name = "sqlite"

    def drain_events(self, connection, timeout=None):
        """Kombu's loop, but a consumer whose prefetch is full (it holds all the messages it may, and no query
        was made) looks again after PREFETCH_WAIT_SECONDS instead of a whole polling interval: otherwise a
        worker that finishes a task idles up to that long before its next (a limit of about concurrency /
        polling_interval tasks a second)."""
        started = monotonic()
        polling_interval = self.polling_interval
        if timeout and polling_interval and polling_interval > timeout:
            polling_interval = timeout
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                if timeout is not None and monotonic() - started >= timeout:
                    raise TimeoutError() from None
                full = any(channel._consumers and not channel.qos.can_consume() for channel in self.channels)
                sleep(min(PREFETCH_WAIT_SECONDS, polling_interval or 0) if full else (polling_interval or 0))
