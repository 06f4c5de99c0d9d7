"""FakeDesk itself: a `Desk` bound to a port, served by `handler.Handler` from a daemon thread."""

import socket
import threading
from http.server import ThreadingHTTPServer

from .desk import DEFAULT_RETENTION_SECONDS, Desk
from .dialects import handler_for
from .handler import hard_close


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, desk: Desk):
        self.desk = desk
        self.live_connections: set[socket.socket] = set()
        self.live_lock = threading.Lock()
        super().__init__(address, handler_for(desk.dialect))

    def close_live_connections(self):
        # Keep-alive connections would otherwise outlive the server (as a crash would not).
        with self.live_lock:
            connections = list(self.live_connections)
        for connection in connections:
            hard_close(connection)


class FakeDesk(Desk):
    """The server: bind on construction (so `.url` is known), `start()` serves from a daemon thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        db_path: str | None = None,
        token: str | None = None,
        idempotency_enabled: bool = True,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        dialect: str = "zendesk",
        search_lag_seconds: float = 0.0,
        quota_per_minute: int | None = None,
    ):
        handler_for(dialect)  # an unknown dialect fails here, before a port is bound
        super().__init__(
            db_path=db_path,
            token=token,
            idempotency_enabled=idempotency_enabled,
            retention_seconds=retention_seconds,
            dialect=dialect,
            search_lag_seconds=search_lag_seconds,
            quota_per_minute=quota_per_minute,
        )
        self._thread: threading.Thread | None = None
        try:
            self._server = _Server((host, port), self)
        except OSError:
            self.store.close()
            raise

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> "FakeDesk":
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=f"fakedesk:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self):
        self._stopping.set()  # wakes stalled requests
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._server.close_live_connections()
        self.store.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def tickets(self, base_url: str | None = None) -> list[dict]:
        return super().tickets(base_url or self.url)
