"""FakeGraph: the Microsoft Graph mail subset Mailroom uses, and an Entra ID token endpoint, on 127.0.0.1.

    graph = FakeGraph().start()
    message_id = graph.add_message(raw_bytes)       # immutable id
    graph.notification(client_state="...")          # a change-notification body
    graph.stop()

Endpoints (bearer token required on /v1.0/):
    POST   /{tenant}/oauth2/v2.0/token                         client_credentials or refresh_token
    GET    /v1.0/users/{u}/mailFolders/{folder}/messages/delta  $select, $filter=receivedDateTime ge X,
                                                                $skiptoken / $deltatoken; paged by
                                                                Prefer: odata.maxpagesize; ids are
                                                                immutable only with Prefer: IdType="ImmutableId"
    GET    /v1.0/users/{u}/mailFolders/{folder}/messages        $filter=receivedDateTime ge/le/lt X, $top, $skip
    GET    /v1.0/users/{u}/messages/{id}/$value                 the MIME (immutable or REST id)
    POST   /v1.0/subscriptions                                  validates notificationUrl when `validate` is set
    PATCH  /v1.0/subscriptions/{id}                             renew
    DELETE /v1.0/subscriptions/{id}

Sync states (skip and delta tokens) live in the server; `expire_sync_states()`
forgets them, after which they answer 410 `syncStateNotFound` (or the status and
code given). Faults as in `tests.fake_google.FakeServer`.
"""

import json
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, quote

import requests

from tests.fake_google import FakeServer

MAX_SUBSCRIPTION_MINUTES = 10080


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class FakeGraph(FakeServer):
    def __init__(
        self,
        *,
        tenant="tenant-1",
        client_id="graph-client",
        client_secret="graph-secret",
        refresh_token=None,
        user="support@acme.test",
        token_lifetime=3600,
    ):
        super().__init__()
        self.tenant, self.client_id, self.client_secret = tenant, client_id, client_secret
        self.refresh_token = refresh_token
        self.user = user
        self.token_lifetime = token_lifetime
        self.access_tokens: dict[str, float] = {}
        self.token_requests = 0
        # As Entra ID does: a refresh answers a new refresh token; here the one sent is then void too
        # (rotate_refresh_tokens; a voided one sent again is recorded in reused_refresh_tokens).
        self.rotate_refresh_tokens = False
        self.rotated_refresh_tokens: list[str] = []
        self.reused_refresh_tokens: list[str] = []
        self.messages: list[dict] = []
        self.change_seq = 0
        self.states: dict[str, dict] = {}
        self.expired_answer = (410, "syncStateNotFound")
        self.subscriptions: dict[str, dict] = {}
        self.validate = False
        self.validations: list[dict] = []
        self.default_page_size = 10
        self._validation_lock = threading.Lock()

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1.0"

    @property
    def token_url(self) -> str:
        return f"{self.url}/{self.tenant}/oauth2/v2.0/token"

    # --- Test helpers -------------------------------------------------------------

    def add_message(self, raw: bytes, folder: str = "inbox", age_days: float = 0) -> str:
        with self.lock:
            self.change_seq += 1
            n = len(self.messages) + 1
            message = {
                "immutable": f"AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0AImm{n:06d}=",
                "rest": f"AAMkAGRest{n:06d}-{folder}=",
                "raw": raw,
                "folder": folder,
                "deleted": False,
                "changed": self.change_seq,
                "received": datetime.now(UTC) - timedelta(days=age_days),
            }
            self.messages.append(message)
            return message["immutable"]

    def _find(self, message_id: str):
        for message in self.messages:
            if message_id in (message["immutable"], message["rest"]):
                return message
        return None

    def move_message(self, message_id: str, folder: str):
        """Moving changes a message's REST id, never its immutable id."""
        with self.lock:
            self.change_seq += 1
            message = self._find(message_id)
            message.update(
                folder=folder,
                changed=self.change_seq,
                left=message["folder"],
                rest=f"AAMkAGRest{self.messages.index(message) + 1:06d}-{folder}=",
            )

    def mark_read(self, message_id: str):
        with self.lock:
            self.change_seq += 1
            self._find(message_id)["changed"] = self.change_seq

    def delete_message(self, message_id: str):
        with self.lock:
            self.change_seq += 1
            self._find(message_id).update(deleted=True, changed=self.change_seq)

    def expire_sync_states(self, status: int = 410, code: str = "syncStateNotFound"):
        with self.lock:
            self.states.clear()
            self.expired_answer = (status, code)

    def revoke_tokens(self):
        with self.lock:
            self.access_tokens.clear()

    def notification(
        self,
        client_state: str | None,
        *,
        subscription_id: str | None = None,
        lifecycle: str | None = None,
        count: int = 1,
        message_id: str = "AAkAL-x=",
    ) -> bytes:
        if subscription_id is None:
            subscription_id = next(iter(self.subscriptions), "sub-unknown")
        items = []
        for _ in range(count):
            item = {
                "subscriptionId": subscription_id,
                "subscriptionExpirationDateTime": _iso(datetime.now(UTC) + timedelta(days=2)),
                "tenantId": self.tenant,
            }
            if client_state is not None:
                item["clientState"] = client_state
            if lifecycle:
                item["lifecycleEvent"] = lifecycle
            else:
                item.update(
                    changeType="created",
                    resource=f"Users/{self.user}/Messages/{message_id}",
                    resourceData={"@odata.type": "#Microsoft.Graph.Message", "id": message_id},
                )
            items.append(item)
        return json.dumps({"value": items}).encode()

    def value_fetches(self, message_id: str | None = None) -> int:
        with self.lock:
            return sum(
                1
                for r in self.requests
                if r["method"] == "GET"
                and r["path"].endswith("/$value")
                and (message_id is None or f"/messages/{message_id}/" in r["path"])
            )

    # --- Routing ----------------------------------------------------------------------

    def route(self, method, path, query, headers, body):
        if path == f"/{self.tenant}/oauth2/v2.0/token" and method == "POST":
            return self._token(body)
        if not path.startswith("/v1.0/"):
            return 404, {}, {"error": {"code": "ResourceNotFound"}}
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        with self.lock:
            valid = scheme == "Bearer" and self.access_tokens.get(token, 0) > time.time()
        if not valid:
            return (
                401,
                {},
                {
                    "error": {
                        "code": "InvalidAuthenticationToken",
                        "message": "Access token has expired or is not yet valid.",
                    }
                },
            )
        parts = path[len("/v1.0/") :].split("/")
        prefer = headers.get("Prefer", "")
        if parts[0] == "subscriptions":
            return self._subscriptions(method, parts[1:], body)
        if len(parts) < 2 or parts[0] != "users" or parts[1] not in (self.user,):
            return 404, {}, {"error": {"code": "ErrorInvalidUser"}}
        rest = parts[2:]
        with self.lock:
            if method == "GET" and len(rest) == 4 and rest[0] == "mailFolders" and rest[2:] == ["messages", "delta"]:
                return self._delta(rest[1], query, prefer)
            if method == "GET" and len(rest) == 3 and rest[0] == "mailFolders" and rest[2] == "messages":
                return self._list(rest[1], query, prefer)
            if method == "GET" and len(rest) == 3 and rest[0] == "messages" and rest[2] == "$value":
                message = self._find(rest[1])
                if message is None or message["deleted"]:
                    return 404, {}, {"error": {"code": "ErrorItemNotFound"}}
                return 200, {"Content-Type": "text/plain"}, message["raw"]
        return 404, {}, {"error": {"code": "ResourceNotFound"}}

    def _token(self, body: bytes):
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        with self.lock:
            self.token_requests += 1
            ok = form.get("client_id") == self.client_id and form.get("client_secret") == self.client_secret
            if form.get("grant_type") == "client_credentials":
                ok = ok and form.get("scope") == "https://graph.microsoft.com/.default"
            elif form.get("grant_type") == "refresh_token":
                ok = ok and self.refresh_token is not None and form.get("refresh_token") == self.refresh_token
            else:
                ok = False
            if not ok and form.get("refresh_token") in self.rotated_refresh_tokens:
                self.reused_refresh_tokens.append(form["refresh_token"])
                return (
                    400,
                    {},
                    {
                        "error": "invalid_grant",
                        "error_description": "AADSTS70000: The provided value for the 'refresh_token' is not valid.",
                    },
                )
            if not ok:
                return (
                    401,
                    {},
                    {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret."},
                )
            token = "eyJ0eXAi." + secrets.token_urlsafe(16)
            self.access_tokens[token] = time.time() + self.token_lifetime
            answer = {"token_type": "Bearer", "expires_in": self.token_lifetime, "access_token": token}
            if self.rotate_refresh_tokens and form.get("grant_type") == "refresh_token":
                self.rotated_refresh_tokens.append(self.refresh_token)
                self.refresh_token = answer["refresh_token"] = "0.AXoA" + secrets.token_urlsafe(24)
        return 200, {}, answer

    def _delta(self, folder: str, query, prefer: str):
        immutable = 'IdType="ImmutableId"' in prefer
        page_size = self.default_page_size
        for preference in prefer.split(","):
            name, _, value = preference.strip().partition("=")
            if name == "odata.maxpagesize" and value.isdigit():
                page_size = int(value)
        skip = (query.get("$skiptoken") or [None])[0]
        delta = (query.get("$deltatoken") or [None])[0]
        token = skip or delta
        if token is not None:
            state = self.states.get(token)
            if state is None or state["folder"] != folder:
                status, code = self.expired_answer
                return status, {}, {"error": {"code": code, "message": "The sync state is no longer valid."}}
        if skip:
            items, offset, watermark, since = state["items"], state["offset"], state["watermark"], state["since"]
        else:
            if delta:
                since = state["since"]
                items = [
                    m
                    for m in self.messages
                    if m["folder"] == folder
                    and m["changed"] > state["watermark"]
                    or (m.get("left") == folder and m["changed"] > state["watermark"])
                ]
            else:
                flt = (query.get("$filter") or [""])[0]
                since = _parse(flt.split(" ge ", 1)[1]) if " ge " in flt else None
                items = [m for m in self.messages if m["folder"] == folder and not m["deleted"]]
            items = [m for m in items if since is None or m["received"] >= since or m["deleted"]]
            offset, watermark = 0, self.change_seq
        page, offset = items[offset : offset + page_size], offset + page_size
        value = []
        for message in page:
            message_id = message["immutable"] if immutable else message["rest"]
            if message["deleted"] or message["folder"] != folder:
                value.append({"id": message_id, "@removed": {"reason": "deleted"}})
            else:
                value.append(
                    {
                        "@odata.type": "#microsoft.graph.message",
                        "id": message_id,
                        "receivedDateTime": _iso(message["received"]),
                    }
                )
        new_token = secrets.token_urlsafe(12)
        link = f"{self.api_base}/users/{quote(self.user)}/mailFolders/{folder}/messages/delta"
        answer = {"@odata.context": f"{self.api_base}/$metadata#Collection(message)", "value": value}
        if offset < len(items):
            self.states[new_token] = {
                "folder": folder,
                "items": items,
                "offset": offset,
                "watermark": watermark,
                "since": since,
            }
            answer["@odata.nextLink"] = f"{link}?$skiptoken={new_token}"
        else:
            self.states[new_token] = {"folder": folder, "watermark": watermark, "since": since}
            answer["@odata.deltaLink"] = f"{link}?$deltatoken={new_token}"
        return 200, {}, answer

    def _list(self, folder: str, query, prefer: str):
        """`GET .../mailFolders/{folder}/messages`: $filter on receivedDateTime (ge, le, lt joined by "and"),
        $top, $skip, newest first; `@odata.nextLink` while more match."""
        immutable = 'IdType="ImmutableId"' in prefer
        terms = [t.strip().split(" ", 2) for t in (query.get("$filter") or [""])[0].split(" and ") if t.strip()]
        tests = {"ge": lambda a, b: a >= b, "le": lambda a, b: a <= b, "lt": lambda a, b: a < b}
        bounds = [(tests[op], _parse(value)) for name, op, value in terms if name == "receivedDateTime"]
        top = int((query.get("$top") or ["10"])[0])
        skip = int((query.get("$skip") or ["0"])[0])
        items = sorted(
            (
                m
                for m in self.messages
                if m["folder"] == folder
                and not m["deleted"]
                and all(test(m["received"], bound) for test, bound in bounds)
            ),
            key=lambda m: m["received"],
            reverse=True,
        )
        value = [
            {"id": m["immutable"] if immutable else m["rest"], "receivedDateTime": _iso(m["received"])}
            for m in items[skip : skip + top]
        ]
        answer = {"value": value}
        if skip + top < len(items):
            params = "&".join(f"{k}={quote(v[0])}" for k, v in query.items() if k != "$skip")
            answer["@odata.nextLink"] = (
                f"{self.api_base}/users/{quote(self.user)}/mailFolders/{folder}/messages?{params}&$skip={skip + top}"
            )
        return 200, {}, answer

    def _subscriptions(self, method: str, rest: list[str], body: bytes):
        request = json.loads(body or b"{}") if body else {}
        now = datetime.now(UTC)
        if method == "POST" and not rest:
            missing = [
                k for k in ("changeType", "notificationUrl", "resource", "expirationDateTime") if not request.get(k)
            ]
            if missing:
                return 400, {}, {"error": {"code": "InvalidRequest", "message": f"missing {missing}"}}
            expires = _parse(request["expirationDateTime"])
            if not now < expires <= now + timedelta(minutes=MAX_SUBSCRIPTION_MINUTES):
                return 400, {}, {"error": {"code": "InvalidRequest", "message": "bad expirationDateTime"}}
            if len(request.get("clientState") or "") > 128:
                return 400, {}, {"error": {"code": "InvalidRequest", "message": "clientState too long"}}
            if self.validate and not self._validate(request["notificationUrl"]):
                return (
                    400,
                    {},
                    {"error": {"code": "ValidationError", "message": "Subscription validation request failed."}},
                )
            subscription_id = f"sub-{secrets.token_hex(6)}"
            with self.lock:
                self.subscriptions[subscription_id] = {**request, "id": subscription_id}
            return (
                201,
                {},
                {
                    "id": subscription_id,
                    "resource": request["resource"],
                    "changeType": request["changeType"],
                    "notificationUrl": request["notificationUrl"],
                    "expirationDateTime": _iso(expires).replace("Z", ".0000000Z"),
                },
            )
        with self.lock:
            subscription = self.subscriptions.get(rest[0]) if rest else None
            if subscription is None:
                return 404, {}, {"error": {"code": "ResourceNotFound", "message": "subscription not found"}}
            if method == "PATCH":
                expires = _parse(request["expirationDateTime"])
                if not now < expires <= now + timedelta(minutes=MAX_SUBSCRIPTION_MINUTES):
                    return 400, {}, {"error": {"code": "InvalidRequest", "message": "bad expirationDateTime"}}
                subscription["expirationDateTime"] = request["expirationDateTime"]
                subscription["renewals"] = subscription.get("renewals", 0) + 1
                return 200, {}, {**subscription, "clientState": None}
            if method == "DELETE":
                del self.subscriptions[rest[0]]
                return 204, {}, b""
        return 405, {}, {"error": {"code": "MethodNotAllowed"}}

    def _validate(self, url: str) -> bool:
        """What Graph does before it creates a subscription: POST a validationToken, expect it back."""
        token = (
            f"Validation: Testing client application reachability for subscription Request-Id: {secrets.token_hex(8)}"
        )
        try:
            response = requests.post(
                url,
                params={"validationToken": token},
                data=b"",
                headers={"Content-Type": "text/plain; charset=utf-8"},
                timeout=10,
            )
        except requests.RequestException as exc:
            self.validations.append({"ok": False, "error": type(exc).__name__})
            return False
        ok = (
            response.status_code == 200
            and response.text == token
            and response.headers.get("Content-Type", "").split(";")[0].strip() == "text/plain"
        )
        self.validations.append(
            {"ok": ok, "status": response.status_code, "content_type": response.headers.get("Content-Type")}
        )
        return ok
