"""FakeGoogle: the Gmail API subset Mailroom uses, an OAuth token endpoint and a JWKS, on 127.0.0.1.

    google = FakeGoogle().start()          # port 0: the OS picks one
    google.add_message(raw_bytes)          # appends a messageAdded history record
    token = google.mint(aud="https://...") # an RS256 OIDC token as Pub/Sub would send
    google.stop()

Endpoints (bearer token from /token required on /gmail/):
    POST /token                                         refresh_token grant
    GET  /oauth2/v3/certs                               JWKS of the signing key(s)
    GET  /gmail/v1/users/{u}/profile                    emailAddress, historyId
    GET  /gmail/v1/users/{u}/history                    startHistoryId, labelId, historyTypes,
                                                        maxResults, pageToken; 404 when too old
    GET  /gmail/v1/users/{u}/messages                   q=newer_than:Nd after:N before:N (epoch s), labelIds,
                                                        maxResults, pageToken
    GET  /gmail/v1/users/{u}/messages/{id}?format=raw   base64url raw, unpadded
    POST /gmail/v1/users/{u}/watch                      historyId, expiration (ms)

Faults: `fail(path_contains, status, times=1, headers=..., body=...)` answers the
next matching requests with that status; `fail(path_contains, drop=True)` closes
the connection without an answer. Every request is logged (`requests`).
"""

import base64
import json
import secrets
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm


class FakeServer:
    """A threaded HTTP server with a request log and per-request fault injection."""

    def __init__(self):
        self.lock = threading.RLock()
        self.requests: list[dict] = []
        self.faults: list[dict] = []
        self.httpd = None
        self.url = ""

    def start(self, ssl_context=None):
        """Serve on a free port; with `ssl_context` (a server-side ssl.SSLContext) over HTTPS."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = {k: v for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                entry = {
                    "method": self.command,
                    "path": unquote(parts.path),
                    "query": query,
                    "headers": dict(self.headers.items()),
                    "body": body,
                }
                with fake.lock:
                    fake.requests.append(entry)
                    fault = fake._take_fault(self.command, entry["path"])
                if fault and fault.get("drop"):
                    self.close_connection = True
                    return
                if fault:
                    status, headers, payload = fault["status"], fault.get("headers") or {}, fault.get("body")
                else:
                    try:
                        status, headers, payload = fake.route(
                            self.command, entry["path"], query, entry["headers"], body
                        )
                    except Exception as exc:  # a bug in the fake must show, not hang the client
                        status, headers, payload = 599, {}, {"error": f"fake crashed: {exc!r}"}
                if isinstance(payload, (dict, list)):
                    data = json.dumps(payload).encode()
                    headers = {"Content-Type": "application/json", **headers}
                else:
                    data = payload if isinstance(payload, bytes) else str(payload or "").encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self):
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()

    def fail(
        self,
        path_contains: str,
        status: int = 500,
        *,
        times: int = 1,
        headers=None,
        body=None,
        drop: bool = False,
        method: str | None = None,
    ):
        with self.lock:
            self.faults.append(
                {
                    "path": path_contains,
                    "status": status,
                    "times": times,
                    "headers": headers,
                    "body": body if body is not None else {"error": {"code": status}},
                    "drop": drop,
                    "method": method,
                }
            )

    def _take_fault(self, method: str, path: str):
        for fault in self.faults:
            if fault["times"] > 0 and fault["path"] in path and (fault["method"] in (None, method)):
                fault["times"] -= 1
                return fault
        return None

    def count(self, method: str, path_contains: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r["method"] == method and path_contains in r["path"])

    def route(self, method, path, query, headers, body):
        raise NotImplementedError


class FakeGoogle(FakeServer):
    def __init__(
        self,
        *,
        email="support@acme.test",
        client_id="google-client",
        client_secret="google-secret",
        refresh_token="google-refresh",
        token_lifetime=3600,
    ):
        super().__init__()
        self.email = email
        self.client_id, self.client_secret, self.refresh_token = client_id, client_secret, refresh_token
        self.token_lifetime = token_lifetime
        self.access_tokens: dict[str, float] = {}
        self.token_requests = 0
        # rotate_refresh_tokens: every refresh answers a new refresh token and voids the one sent (a client
        # that sends a voided one again is recorded in reused_refresh_tokens).
        self.rotate_refresh_tokens = False
        self.rotated_refresh_tokens: list[str] = []
        self.reused_refresh_tokens: list[str] = []
        self.messages: dict[str, dict] = {}
        self.history: list[dict] = []
        self.history_id = 5000
        self.oldest_history_id = 5000
        self.watches: list[dict] = []
        self._seq = 0
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "fake-key-1"

    # --- Test helpers -------------------------------------------------------------

    def add_message(self, raw: bytes, labels=("INBOX",), age_days: float = 0) -> str:
        with self.lock:
            self._seq += 1
            message_id = f"18c{self._seq:013x}"
            self.history_id += 7  # Gmail's history ids grow, not by one
            self.messages[message_id] = {
                "raw": raw,
                "labels": list(labels),
                "thread": f"t{message_id}",
                "internal_ms": int((time.time() - age_days * 86400) * 1000),
                "deleted": False,
            }
            self.history.append(
                {
                    "id": self.history_id,
                    "messagesAdded": [
                        {"message": {"id": message_id, "threadId": f"t{message_id}", "labelIds": list(labels)}}
                    ],
                }
            )
            return message_id

    def add_label(self, message_id: str, label: str):
        with self.lock:
            self.history_id += 3
            self.messages[message_id]["labels"].append(label)
            self.history.append(
                {
                    "id": self.history_id,
                    "labelsAdded": [
                        {
                            "message": {
                                "id": message_id,
                                "threadId": f"t{message_id}",
                                "labelIds": list(self.messages[message_id]["labels"]),
                            },
                            "labelIds": [label],
                        }
                    ],
                }
            )

    def delete_message(self, message_id: str):
        with self.lock:
            self.messages[message_id]["deleted"] = True

    def expire_history(self):
        """Forget every history record so far: any stored startHistoryId now answers 404."""
        with self.lock:
            self.history_id += 1
            self.oldest_history_id = self.history_id

    def revoke_tokens(self):
        with self.lock:
            self.access_tokens.clear()

    @property
    def issuer(self) -> str:
        return "https://accounts.google.com"

    def jwks(self) -> dict:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def mint(
        self,
        aud: str,
        *,
        iss: str | None = None,
        email: str = "pubsub@proj.iam.gserviceaccount.com",
        expires_in: int = 3600,
        key=None,
        kid: str | None = None,
        **claims,
    ) -> str:
        now = int(time.time())
        payload = {
            "iss": iss or self.issuer,
            "aud": aud,
            "iat": now - 5,
            "exp": now + expires_in,
            "sub": "1234567890",
            "email": email,
            "email_verified": True,
            **claims,
        }
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def push_body(self, history_id: int | None = None, email: str | None = None) -> bytes:
        data = json.dumps({"emailAddress": email or self.email, "historyId": history_id or self.history_id})
        return json.dumps(
            {
                "message": {
                    "data": base64.b64encode(data.encode()).decode(),
                    "messageId": secrets.token_hex(6),
                    "publishTime": "2026-11-29T10:00:00Z",
                    "attributes": {},
                },
                "subscription": "projects/acme/subscriptions/mailroom-push",
            }
        ).encode()

    def raw_fetches(self, message_id: str | None = None) -> int:
        with self.lock:
            return sum(
                1
                for r in self.requests
                if r["method"] == "GET"
                and "/messages/" in r["path"]
                and (message_id is None or r["path"].endswith("/" + message_id))
            )

    # --- Routing ----------------------------------------------------------------------

    def route(self, method, path, query, headers, body):
        if path == "/token" and method == "POST":
            return self._token(body)
        if path == "/oauth2/v3/certs":
            return 200, {"Cache-Control": "public, max-age=3600"}, self.jwks()
        if not path.startswith("/gmail/v1/users/"):
            return 404, {}, {"error": {"code": 404, "status": "NOT_FOUND"}}
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        with self.lock:
            valid = scheme == "Bearer" and self.access_tokens.get(token, 0) > time.time()
        if not valid:
            return (
                401,
                {"WWW-Authenticate": "Bearer"},
                {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "Invalid Credentials"}},
            )
        rest = path[len("/gmail/v1/users/") :].split("/")
        user, rest = rest[0], rest[1:]
        if user not in ("me", self.email):
            return 404, {}, {"error": {"code": 404, "status": "NOT_FOUND"}}
        one = lambda name: (query.get(name) or [None])[0]  # noqa: E731
        with self.lock:
            if rest == ["profile"] and method == "GET":
                return (
                    200,
                    {},
                    {
                        "emailAddress": self.email,
                        "messagesTotal": len(self.messages),
                        "historyId": str(self.history_id),
                    },
                )
            if rest == ["history"] and method == "GET":
                return self._history(
                    int(one("startHistoryId") or 0), query, int(one("maxResults") or 100), int(one("pageToken") or 0)
                )
            if rest == ["messages"] and method == "GET":
                return self._list(query, int(one("maxResults") or 100), int(one("pageToken") or 0))
            if len(rest) == 2 and rest[0] == "messages" and method == "GET":
                return self._get(rest[1], one("format"))
            if rest == ["watch"] and method == "POST":
                request = json.loads(body or b"{}")
                self.watches.append(request)
                expiration = int((time.time() + 7 * 86400) * 1000)
                return 200, {}, {"historyId": str(self.history_id), "expiration": str(expiration)}
        return 404, {}, {"error": {"code": 404, "status": "NOT_FOUND"}}

    def _token(self, body: bytes):
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        with self.lock:
            self.token_requests += 1
            if (
                form.get("grant_type") != "refresh_token"
                or form.get("client_id") != self.client_id
                or form.get("client_secret") != self.client_secret
                or form.get("refresh_token") != self.refresh_token
            ):
                if form.get("refresh_token") in self.rotated_refresh_tokens:
                    self.reused_refresh_tokens.append(form["refresh_token"])
                return 400, {}, {"error": "invalid_grant", "error_description": "Bad Request"}
            token = "ya29." + secrets.token_urlsafe(16)
            self.access_tokens[token] = time.time() + self.token_lifetime
            answer = {
                "access_token": token,
                "expires_in": self.token_lifetime,
                "token_type": "Bearer",
                "scope": "https://www.googleapis.com/auth/gmail.readonly",
            }
            if self.rotate_refresh_tokens:
                self.rotated_refresh_tokens.append(self.refresh_token)
                self.refresh_token = answer["refresh_token"] = "1//" + secrets.token_urlsafe(16)
        return 200, {}, answer

    def _history(self, start: int, query, page_size: int, offset: int):
        if start < self.oldest_history_id:
            return (
                404,
                {},
                {"error": {"code": 404, "message": "Requested entity was not found.", "status": "NOT_FOUND"}},
            )
        label = (query.get("labelId") or [None])[0]
        types = set(query.get("historyTypes") or ["messageAdded", "labelAdded", "messageDeleted", "labelRemoved"])
        records = []
        for record in self.history:
            if record["id"] <= start:
                continue
            kept = {"id": str(record["id"])}
            if "messageAdded" in types and record.get("messagesAdded"):
                added = [a for a in record["messagesAdded"] if label is None or label in a["message"]["labelIds"]]
                if added:
                    kept["messagesAdded"] = added
            if "labelAdded" in types and record.get("labelsAdded"):
                added = [a for a in record["labelsAdded"] if label is None or label in a["message"]["labelIds"]]
                if added:
                    kept["labelsAdded"] = added
            if len(kept) > 1:
                records.append(kept)
        page = records[offset : offset + page_size]
        answer = {"historyId": str(self.history_id)}
        if page:
            answer["history"] = page
        if offset + page_size < len(records):
            answer["nextPageToken"] = str(offset + page_size)
        return 200, {}, answer

    def _list(self, query, page_size: int, offset: int):
        label = (query.get("labelIds") or [None])[0]
        q = (query.get("q") or [""])[0]
        newer, after, before = None, None, None
        for term in q.split():  # newer_than:Nd, after:<epoch s>, before:<epoch s> (others are not filtered here)
            if term.startswith("newer_than:") and term.endswith("d"):
                newer = time.time() - int(term[len("newer_than:") : -1]) * 86400
            elif term.startswith("after:"):
                after = int(term[len("after:") :])
            elif term.startswith("before:"):
                before = int(term[len("before:") :])
        matches = [
            (m["internal_ms"], mid)
            for mid, m in self.messages.items()
            if not m["deleted"]
            and (label is None or label in m["labels"])
            and (newer is None or m["internal_ms"] / 1000 >= newer)
            and (after is None or m["internal_ms"] / 1000 > after)
            and (before is None or m["internal_ms"] / 1000 < before)
        ]
        matches.sort(reverse=True)  # newest first, as Gmail lists
        page = matches[offset : offset + page_size]
        answer = {"resultSizeEstimate": len(matches)}
        if page:
            answer["messages"] = [{"id": mid, "threadId": f"t{mid}"} for _, mid in page]
        if offset + page_size < len(matches):
            answer["nextPageToken"] = str(offset + page_size)
        return 200, {}, answer

    def _get(self, message_id: str, fmt: str | None):
        message = self.messages.get(message_id)
        if message is None or message["deleted"]:
            return 404, {}, {"error": {"code": 404, "status": "NOT_FOUND"}}
        if fmt != "raw":
            return 400, {}, {"error": {"code": 400, "message": "this fake only serves format=raw"}}
        return (
            200,
            {},
            {
                "id": message_id,
                "threadId": message["thread"],
                "labelIds": message["labels"],
                "internalDate": str(message["internal_ms"]),
                "sizeEstimate": len(message["raw"]),
                "raw": base64.urlsafe_b64encode(message["raw"]).decode().rstrip("="),
            },
        )


def http_date(seconds_ahead: int) -> str:
    return formatdate(time.time() + seconds_ahead, usegmt=True)
