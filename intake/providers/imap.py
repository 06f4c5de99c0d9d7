"""IMAP polling with `imapclient`, strictly read-only.

The folder is opened with EXAMINE and messages are fetched with `BODY.PEEK[]`:
nothing ever sets `\\Seen`, moves, expunges or deletes anything on the server.

Settings (`Mailbox.settings`): `host`, `port` (993 with ssl, else 143), `ssl`
(default true), `starttls` (default false), `username`, `folder` (default
INBOX); optional `batch_size` (5000), `max_batch_bytes` (4 MiB), `overlap` (20),
`sync_days` (7), `timeout` (60 s). `credentials_ref` resolves to the password; with `auth: "xoauth2"` to
OAuth credentials instead (intake.providers.imap_oauth: `oauth_flavor`, `token_url`/`authority`, `client_id`,
`scope`), and the login is SASL XOAUTH2 (or OAUTHBEARER with `sasl: "oauthbearer"`) with an access token.
The host passes the egress guard (`intake.egress`): when the mailbox is saved, and when it is connected
(`GuardedIMAPClient` resolves, checks every address and connects to the checked one; TLS keeps the name).

The cursor (stored by the polling service only after the batch is committed):

    {"uidvalidity": V, "last_uid": U, "seen": [UIDs ingested in (U - overlap, U]],
     "sync_since": "YYYY-MM-DD", "sync_max_uid": M}     # the last two only while they matter

* Each poll re-reads an overlap: it searches from `U - overlap + 1`, so a
  message that became visible late under a UID at or below `U` is still found.
  UIDs of the overlap already in `seen` are not fetched again; the others are
  (and the dedupe key makes a message fetched twice free).
* UIDs mean nothing across a UIDVALIDITY change (a folder deleted and recreated,
  a server migration). When the server's UIDVALIDITY differs from the cursor's
  (or there is no cursor yet), the poll resyncs: it takes the messages that
  existed at that moment (UID <= M) only if their internal date is within the
  last `sync_days` days, and every message that arrives afterwards. The
  provider message id is the RFC 5322 Message-ID (sha256 of the bytes without
  one), so messages already ingested under their old UIDs are duplicates.
* Batches are sized by bytes: as many messages as fit in `max_batch_bytes` (but
  always at least one, and at most `batch_size`), using RFC822.SIZE (fetched once
  per poll and UID) before fetching bodies; one UID FETCH of the bodies per batch.
* Archive import (`Mailbox.archive_before` set, `archive_done_at` not yet): besides the live
  mail above (fetched first, ticketed as usual), the poll scans UIDs 1..`max_uid` (those the
  live path had not taken whole when the import began) for every message whose INTERNALDATE
  is before the cut-off, whatever `sync_days` says, in bounded batches, its place kept in the
  cursor as `"archive": {"before", "max_uid", "next_uid"}`. The batch that ends the scan says
  `archive_done`. While a cut-off is set, any message fetched (polled or listed) with an
  INTERNALDATE before it is `history`; a resync's window then starts no earlier than the
  cut-off's day (the mail before it is the scan's).

Listing (the reconciler's view, `list_recent`): `UID SEARCH SINCE <a day before since>` in the
folder, in UID order from the resume point, at most `limit` UIDs; for those, INTERNALDATE and
`BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)]` only (the whole message only when it has no Message-ID,
since its id is then the content fingerprint). INTERNALDATE decides the exact window.
"""

import functools
import imaplib
import logging
import re
import ssl as ssl_module
from datetime import date, datetime, timedelta

from imapclient import IMAPClient, exceptions as imap_errors, imap4, tls

from intake.egress import IMAP_PORTS, EgressPolicy, EgressRefused, check_host, open_connection
from intake.keys import message_id_from_raw, provider_message_id_for_raw, raw_message_keys
from intake.logging import mask_address
from intake.secrets import SecretUnavailable, resolve_secret

from . import imap_oauth
from .base import FetchedMessage, ListedMessage, Listing, PermanentError, PollBatch, Provider, TransientError

logger = logging.getLogger(__name__)

# Batches are sized by bytes: the byte budget decides, the count is only a ceiling.
DEFAULT_BATCH_SIZE = 5000
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024
# UIDs per RFC822.SIZE fetch while a batch is being sized.
SIZE_CHUNK = 1000
DEFAULT_OVERLAP = 20
DEFAULT_SYNC_DAYS = 7
DEFAULT_TIMEOUT = 60.0

# Login response codes (RFC 5530) that say "try later", not "wrong password".
_TRANSIENT_LOGIN_CODES = (b"[UNAVAILABLE]", b"[INUSE]", b"[LIMIT]", b"[SERVERBUG]")
_TRANSIENT_LOGIN_TEXT = tuple(code.decode() for code in _TRANSIENT_LOGIN_CODES)


IMAP_HOST = EgressPolicy(purpose="IMAP host", ports=IMAP_PORTS)


class _CheckedSocket:
    """imaplib's socket hook (`_create_socket`), connecting through the egress guard: the name is resolved and
    every address checked at connect time, and the socket goes to the checked address (the name stays for TLS)."""

    def _create_socket(self, timeout=None):
        timeout = timeout if timeout is not None else getattr(self, "_timeout", None)
        sock = open_connection(self.host, self.port, policy=IMAP_HOST, timeout=timeout)
        if isinstance(self, tls.IMAP4_TLS):
            return tls.wrap_socket(sock, self.ssl_context, self.host)
        return sock


class _CheckedIMAP4(_CheckedSocket, imap4.IMAP4WithTimeout):
    pass


class _CheckedIMAP4TLS(_CheckedSocket, tls.IMAP4_TLS):
    pass


class GuardedIMAPClient(IMAPClient):
    """IMAPClient whose connection goes through the egress guard (imapclient 3/4 build it in `_create_IMAP4`)."""

    def _create_IMAP4(self):
        connect_timeout = getattr(self._timeout, "connect", None)
        if self.ssl:
            return _CheckedIMAP4TLS(self.host, self.port, self.ssl_context, connect_timeout)
        return _CheckedIMAP4(self.host, self.port, connect_timeout)


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class _Refused(Exception):
    """The server refused the login (its text, addresses masked)."""


class _SaslExchange:
    """imaplib's AUTHENTICATE responder: the initial response to the first challenge, then `after_error` to the
    server's error challenge, then the abort ("*") should the server go on asking."""

    def __init__(self, initial: bytes, after_error: bytes):
        self.initial, self.after_error = initial, after_error
        self.calls = 0

    def __call__(self, challenge: bytes) -> bytes | None:
        self.calls += 1
        if self.calls == 1:
            return self.initial
        return self.after_error if self.calls == 2 else None


class ImapProvider(Provider):
    name = "imap"
    supports_webhook = False
    supports_polling = True
    supports_listing = True

    def __init__(self, mailbox):
        super().__init__(mailbox)
        options = mailbox.settings or {}
        self.host = options.get("host") or ""
        self.use_ssl = bool(options.get("ssl", True))
        self.starttls = bool(options.get("starttls", False))
        self.port = int(options.get("port") or (993 if self.use_ssl else 143))
        self.username = options.get("username") or mailbox.address
        self.folder = options.get("folder") or "INBOX"
        self.batch_size = max(1, int(options.get("batch_size") or DEFAULT_BATCH_SIZE))
        self.max_batch_bytes = max(1, int(options.get("max_batch_bytes") or DEFAULT_MAX_BATCH_BYTES))
        self.overlap = max(0, int(options.get("overlap", DEFAULT_OVERLAP)))
        self.sync_days = max(0, int(options.get("sync_days", DEFAULT_SYNC_DAYS)))
        self.timeout = float(options.get("timeout") or DEFAULT_TIMEOUT)
        self.auth = options.get("auth") or "password"
        self.sasl = options.get("sasl") or "xoauth2"
        self._tokens = None  # an imap_oauth token source, with auth xoauth2
        self._client: IMAPClient | None = None
        self._folder_status: dict | None = None
        self._sizes: dict[int, int] = {}  # RFC822.SIZE by UID, for this connection's folder

    # --- connection ---------------------------------------------------------------------------

    def _connect(self) -> IMAPClient:
        if self._client is not None:
            return self._client
        if not self.host:
            raise PermanentError("settings", "no IMAP host configured")
        if self.auth == "xoauth2":
            self._client = self._oauth_connect()
            return self._client
        try:
            password = resolve_secret(self.mailbox.credentials_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
        except SecretUnavailable as exc:
            raise PermanentError("credentials", f"password reference: {exc}") from None
        client = self._open()
        try:
            self._login(client, lambda: client.login(self.username, password))
        except _Refused as exc:
            raise PermanentError("credentials", str(exc)) from None
        self._client = client
        return client

    def _open(self) -> IMAPClient:
        """A new connection (through the egress guard), STARTTLS done, not logged in."""
        try:
            # Checked here for a clear refusal, and again by the connection itself (against DNS rebinding).
            check_host(self.host, self.port, purpose=IMAP_HOST.purpose, policy=IMAP_HOST)
            client = GuardedIMAPClient(
                self.host,
                port=self.port,
                ssl=self.use_ssl,
                timeout=self.timeout,
                ssl_context=ssl_module.create_default_context() if self.use_ssl else None,
            )
        except EgressRefused as exc:
            raise PermanentError("settings", str(exc)) from None
        except (OSError, imaplib.IMAP4.error) as exc:  # refused, unreachable, TLS, timeout, greeting
            raise TransientError("connection", f"{type(exc).__name__}: {exc}") from None
        if self.starttls:
            try:
                client.starttls(ssl_module.create_default_context())
            except imap_errors.CapabilityError:
                self._drop(client)
                raise PermanentError("settings", "the server does not offer STARTTLS") from None
            except (OSError, imaplib.IMAP4.error) as exc:
                self._drop(client)
                raise TransientError("connection", f"{type(exc).__name__}: {mask_address(_text(exc))}") from None
        return client

    def _login(self, client: IMAPClient, login) -> None:
        """Run `login` on `client`; a NO/BAD is `_Refused`, unless its response code says "try later" (RFC 5530):
        that, and a connection lost mid-way, are TransientError. The client is dropped on any failure."""
        try:
            login()
        except imap_errors.IMAPClientAbortError as exc:  # (the password LOGIN wraps this into a LoginError)
            self._drop(client)
            raise TransientError("connection", f"{type(exc).__name__}: {mask_address(_text(exc))}") from None
        except imaplib.IMAP4.error as exc:  # LoginError from LOGIN, the tagged NO/BAD from AUTHENTICATE
            self._drop(client)
            text = _text(exc)
            if any(code in text for code in _TRANSIENT_LOGIN_TEXT):
                raise TransientError("login unavailable", mask_address(text)) from None
            raise _Refused(mask_address(text) or "login refused") from None
        except OSError as exc:
            self._drop(client)
            raise TransientError("connection", f"{type(exc).__name__}: {mask_address(_text(exc))}") from None

    def _oauth_connect(self) -> IMAPClient:
        """Connect and AUTHENTICATE XOAUTH2 / OAUTHBEARER. A cached token the server refuses may have expired or
        been revoked early: one fresh token, once, on a NEW connection (a server may close the connection after a
        failed AUTHENTICATE). A "try later" refusal is transient before anything is refreshed (a refresh spends a
        rotation); a refused fresh token is a credentials refusal."""
        if self._tokens is None:
            self._tokens = imap_oauth.token_source(self.mailbox)
        for attempt in (1, 2):
            access_token = self._tokens.token()  # PermanentError / TransientError as they come
            client = self._open()
            try:
                # imaplib's AUTHENTICATE itself: imapclient's oauth2_login/oauthbearer_login answer the error
                # challenge with the token again, and call a lost connection a LoginError.
                self._login(client, functools.partial(client._imap.authenticate, *self._sasl(access_token)))
                return client
            except _Refused as exc:
                if attempt == 2 or self._tokens.last_fresh:
                    raise PermanentError("credentials", str(exc)) from None
            self._tokens.invalidate()
        raise AssertionError("unreachable")

    def _sasl(self, access_token: str) -> tuple[str, "_SaslExchange"]:
        """(mechanism, responder). After an error challenge the client must answer, not resend the token: an empty
        response for XOAUTH2 (Google's XOAUTH2 protocol, "Error response"), %x01 for OAUTHBEARER (RFC 7628 §3.2.3)."""
        if self.sasl == "oauthbearer":
            user = self.username.replace("=", "=3D").replace(",", "=2C")  # RFC 5801 saslname
            # RFC 7628 §3.1: gs2 header, then host/port (optional) and the bearer token, each ended by %x01.
            first = f"n,a={user},\x01host={self.host}\x01port={self.port}\x01auth=Bearer {access_token}\x01\x01"
            return "OAUTHBEARER", _SaslExchange(first.encode(), b"\x01")
        return "XOAUTH2", _SaslExchange(f"user={self.username}\x01auth=Bearer {access_token}\x01\x01".encode(), b"")

    @staticmethod
    def _drop(client: IMAPClient) -> None:
        try:
            client.shutdown()
        except Exception:
            pass

    def close(self) -> None:
        session = getattr(self._tokens, "session", None)
        if session is not None:
            session.close()
        client, self._client, self._folder_status = self._client, None, None
        self._sizes = {}
        if client is None:
            return
        try:
            client.logout()
        except Exception:
            self._drop(client)

    def _examine(self) -> dict:
        """Open the folder read-only (EXAMINE) once per poll, and keep its status."""
        if self._folder_status is None:
            client = self._connect()
            try:
                self._folder_status = client.select_folder(self.folder, readonly=True)
            except imap_errors.IMAPClientAbortError as exc:
                raise TransientError("connection", _text(exc)) from None
            except imap_errors.IMAPClientError as exc:
                text = _text(exc)
                if "[NONEXISTENT]" in text or "doesn't exist" in text.lower() or "not exist" in text.lower():
                    raise PermanentError("folder", f"folder {self.folder!r} does not exist") from None
                raise TransientError("examine", text) from None
        return self._folder_status

    # --- polling ------------------------------------------------------------------------------

    @property
    def fetches_ahead(self) -> bool:
        """The poller may fetch the next batch on another thread while it stores this one: a poll uses only
        this connection (no database), except during an archive import, whose end the poller records."""
        return not self._archive_running()

    def poll(self, cursor: dict) -> PollBatch:
        return self._mapping_failures(self._poll, cursor)

    def _mapping_failures(self, operation, *args):
        """Run `operation`, mapping connection and protocol failures to TransientError (closing first)."""
        try:
            return operation(*args)
        except (TransientError, PermanentError):
            self.close()
            raise
        except (imap_errors.IMAPClientAbortError, OSError) as exc:  # the connection broke mid-way
            self.close()
            raise TransientError("connection", f"{type(exc).__name__}: {_text(exc)}") from None
        except imap_errors.IMAPClientError as exc:  # a NO/BAD answer to a command we sent
            self.close()
            raise TransientError("imap", mask_address(_text(exc))) from None

    def _poll(self, cursor: dict) -> PollBatch:
        client = self._connect()
        status = self._examine()
        uidvalidity = int(status[b"UIDVALIDITY"])
        if cursor.get("uidvalidity") != uidvalidity:
            # First poll, or the UIDs we knew are void: resync by date.
            if cursor:
                logger.warning(
                    "UIDVALIDITY of mailbox %s changed (%s -> %s): resync of the last %d days",
                    self.mailbox.slug,
                    cursor.get("uidvalidity"),
                    uidvalidity,
                    self.sync_days,
                )
            uidnext = int(status.get(b"UIDNEXT") or 0)
            sync_max = uidnext - 1 if uidnext else max(client.search(["ALL"]) or [0])
            sync_since = date.today() - timedelta(days=self.sync_days)
            if self._archive_running():  # mail before the cut-off is the archive scan's (_archive_batch)
                sync_since = max(sync_since, self._cutoff().date())
            cursor = {
                "uidvalidity": uidvalidity,
                "last_uid": 0,
                "seen": [],
                "sync_since": sync_since.isoformat(),
                "sync_max_uid": sync_max,
            }
        last_uid = int(cursor.get("last_uid") or 0)
        seen = set(cursor.get("seen") or [])
        low = max(1, last_uid - self.overlap + 1)
        candidates = [uid for uid in self._search_from(client, low, cursor) if uid > last_uid or uid not in seen]
        candidates.sort()

        chosen = self._bounded(client, candidates[: self.batch_size])
        messages = []
        if chosen and self._cutoff() is None:
            bodies = _fetch_bodies(client, chosen)
            # A UID missing here was expunged between SEARCH and FETCH: see below.
            messages = [_fetched(bodies[uid], uid, False) for uid in chosen if uid in bodies]
        elif chosen:
            fetched = client.fetch(chosen, self._body_items())
            for uid in chosen:
                data = fetched.get(uid)
                if data is None or b"BODY[]" not in data:
                    # Expunged between SEARCH and FETCH: nothing to take, never anything to skip silently
                    # that still exists (the next poll searches again).
                    continue
                raw = bytes(data[b"BODY[]"])
                messages.append(_fetched(raw, uid, self._is_history(data)))
        if len(messages) < len(chosen):
            present = {m.metadata["uid"] for m in messages}
            # A UID that vanished mid-batch was expunged: moving past it loses nothing.
            logger.info("%d messages vanished between search and fetch", len(set(chosen) - present))

        new_last = max([last_uid, *chosen])
        new_seen = sorted(uid for uid in seen.union(chosen) if uid > new_last - self.overlap)
        new_cursor = {"uidvalidity": uidvalidity, "last_uid": new_last, "seen": new_seen}
        sync_max = int(cursor.get("sync_max_uid") or 0)
        if "sync_since" in cursor and sync_max and new_last - self.overlap < sync_max:
            # The overlap still reaches messages that predate the resync: keep filtering those by date.
            new_cursor["sync_since"] = cursor["sync_since"]
            new_cursor["sync_max_uid"] = cursor["sync_max_uid"]
        more = len(candidates) > len(chosen)
        if not self._archive_running():
            return PollBatch(messages=messages, cursor=new_cursor, more=more)
        # An archive import: live mail first (it is ticketed as usual from the start), then the history.
        archive = self._archive_state(cursor, uidvalidity)
        if chosen:
            return PollBatch(messages=messages, cursor={**new_cursor, "archive": archive}, more=True)
        history, archive, done = self._archive_batch(client, archive)
        return PollBatch(
            messages=history, cursor={**new_cursor, "archive": archive}, more=more or not done, archive_done=done
        )

    # --- archive import (intake.archive) -------------------------------------------------------

    def _cutoff(self) -> datetime | None:
        return self.mailbox.archive_before

    def _archive_running(self) -> bool:
        return self.mailbox.archive_before is not None and self.mailbox.archive_done_at is None

    def _body_items(self) -> list[str]:
        # With a cut-off, INTERNALDATE says which messages are history.
        return ["BODY.PEEK[]", "INTERNALDATE"] if self._cutoff() is not None else ["BODY.PEEK[]"]

    def _is_history(self, data: dict) -> bool:
        cutoff = self._cutoff()
        arrived = _aware(data.get(b"INTERNALDATE")) if cutoff is not None else None
        return arrived is not None and arrived < cutoff

    def _archive_state(self, cursor: dict, uidvalidity: int) -> dict:
        """The scan of UIDs 1..max_uid for mail before the cut-off; begun again when the cut-off or the
        UIDVALIDITY changed. `max_uid`: the highest UID the live path did not take whole when the import
        began (a resync's `sync_max_uid`, else the cursor's `last_uid`); everything above is live-fetched."""
        before = self._cutoff().isoformat()
        state = cursor.get("archive") if cursor.get("uidvalidity") == uidvalidity else None
        # A finished scan under a running import is a new start (the finishing batch set archive_done_at).
        if isinstance(state, dict) and state.get("before") == before and state["next_uid"] <= state["max_uid"]:
            return state
        highest = max(int(cursor.get("sync_max_uid") or 0), int(cursor.get("last_uid") or 0))
        return {"before": before, "max_uid": highest, "next_uid": 1}

    def _archive_batch(self, client: IMAPClient, state: dict) -> tuple[list[FetchedMessage], dict, bool]:
        """(the next bounded batch of mail before the cut-off, the scan's new state, whether the scan is done)."""
        low, high = int(state["next_uid"]), int(state["max_uid"])
        if low > high:  # ("n:m" with n > m would mean m:n in IMAP)
            return [], state, True
        cutoff = self._cutoff()
        # BEFORE compares dates in the server's time zone: ask to a day later, INTERNALDATE decides.
        criteria = ["UID", f"{low}:{high}", "BEFORE", (cutoff + timedelta(days=1)).date()]
        uids = sorted(uid for uid in (int(u) for u in client.search(criteria)) if low <= uid <= high)
        chunk = uids[: self.batch_size]
        dates = client.fetch(chunk, ["INTERNALDATE"]) if chunk else {}
        older = [uid for uid in chunk if self._is_history(dates.get(uid) or {})]
        chosen = self._bounded(client, older)
        taken = chunk.index(chosen[-1]) + 1 if chosen else len(chunk)
        rest = uids[taken:]
        messages = []
        if chosen:
            bodies = _fetch_bodies(client, chosen)  # a UID missing: expunged since the search, nothing to take
            messages = [_fetched(bodies[uid], uid, history=True) for uid in chosen if uid in bodies]
        state = {**state, "next_uid": rest[0] if rest else high + 1}
        return messages, state, not rest

    def _search_from(self, client: IMAPClient, low: int, cursor: dict) -> list[int]:
        """UIDs >= `low`; those up to `sync_max_uid` only when dated within the resync window."""
        sync_since = cursor.get("sync_since")
        sync_max = int(cursor.get("sync_max_uid") or 0)
        # "n:*" always includes the highest UID, even one below n: keep only what was asked for.
        if not sync_since or low > sync_max:
            return [int(uid) for uid in client.search(["UID", f"{low}:*"]) if int(uid) >= low]
        since = date.fromisoformat(sync_since)
        older = [int(uid) for uid in client.search(["UID", f"{low}:{sync_max}", "SINCE", since])]
        newer = [int(uid) for uid in client.search(["UID", f"{sync_max + 1}:*"]) if int(uid) > sync_max]
        return [uid for uid in older if low <= uid <= sync_max] + newer

    def _bounded(self, client: IMAPClient, uids: list[int]) -> list[int]:
        """The longest prefix of `uids` within `max_batch_bytes` (at least one message)."""
        chosen, total = [], 0
        for start in range(0, len(uids), SIZE_CHUNK):
            chunk = uids[start : start + SIZE_CHUNK]
            missing = [uid for uid in chunk if uid not in self._sizes]
            if missing:
                self._sizes.update(_fetch_sizes(client, missing))
            for uid in chunk:
                size = self._sizes.get(uid, 0)  # none: expunged since the search (the body fetch finds nothing)
                if chosen and total + size > self.max_batch_bytes:
                    return chosen
                chosen.append(uid)
                total += size
        return chosen

    # --- listing (reconciliation) ---------------------------------------------------------------

    def list_recent(self, since: datetime, until: datetime, limit: int, resume: dict | None = None) -> Listing:
        return self._mapping_failures(self._list_recent, since, until, max(1, int(limit)), resume or {})

    def fetch_listed(self, listed: list[ListedMessage]) -> list[FetchedMessage]:
        return self._mapping_failures(self._fetch_listed, listed)

    def _list_recent(self, since: datetime, until: datetime, limit: int, resume: dict) -> Listing:
        client = self._connect()
        uidvalidity = int(self._examine()[b"UIDVALIDITY"])
        after = int(resume.get("after_uid") or 0) if resume.get("uidvalidity") == uidvalidity else 0
        # SINCE compares dates in the server's time zone: ask from a day earlier, INTERNALDATE decides.
        criteria = ["SINCE", (since - timedelta(days=1)).date()]
        if after:
            criteria = ["UID", f"{after + 1}:*", *criteria]
        uids = sorted(uid for uid in (int(u) for u in client.search(criteria)) if uid > after)
        chunk = uids[:limit]
        listed, without_id = [], []
        if chunk:
            fetched = client.fetch(chunk, ["INTERNALDATE", "BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)]"])
            for uid in chunk:
                data = fetched.get(uid)
                if data is None:
                    continue  # expunged since the search
                arrived = _aware(data.get(b"INTERNALDATE"))
                if arrived is not None and not since <= arrived <= until:
                    continue
                header = next((bytes(v) for k, v in data.items() if k.startswith(b"BODY[HEADER")), b"")
                message_id = message_id_from_raw(header + b"\r\n") if header else ""
                if message_id:
                    listed.append(ListedMessage(provider_message_id_for_raw(b"", message_id=message_id), uid))
                else:
                    without_id.append(uid)
        if without_id:
            bodies = client.fetch(without_id, ["BODY.PEEK[]"])
            for uid in without_id:
                raw = (bodies.get(uid) or {}).get(b"BODY[]")
                if raw is not None:
                    listed.append(ListedMessage(provider_message_id_for_raw(bytes(raw)), uid, bytes(raw)))
        more = len(uids) > len(chunk)
        return Listing(listed, {"uidvalidity": uidvalidity, "after_uid": chunk[-1]} if more else None)

    def _fetch_listed(self, listed: list[ListedMessage]) -> list[FetchedMessage]:
        client = self._connect()
        self._examine()
        # With an archive cut-off, what the reconciler stores from before it is history too (never acknowledged).
        dates = (
            client.fetch([int(m.handle) for m in listed], ["INTERNALDATE"])
            if listed and self._cutoff() is not None
            else {}
        )
        messages = [
            FetchedMessage(
                m.provider_message_id,
                m.raw,
                {"uid": m.handle},
                history=self._is_history(dates.get(int(m.handle)) or {}),
            )
            for m in listed
            if m.raw
        ]
        wanted = [int(m.handle) for m in listed if not m.raw]
        if wanted:
            fetched = client.fetch(wanted, ["BODY.PEEK[]"])
            for uid in wanted:
                raw = (fetched.get(uid) or {}).get(b"BODY[]")
                if raw is not None:
                    raw = bytes(raw)
                    messages.append(
                        FetchedMessage(
                            provider_message_id_for_raw(raw),
                            raw,
                            {"uid": uid},
                            history=self._is_history(dates.get(uid) or {}),
                        )
                    )
        return messages


# The two fetches of a poll, read straight from imaplib's answer (bytes lines, and (line, literal) pairs):
# imapclient's general parser costs more CPU per message than everything else the poll does with it.
_UID_ITEM = re.compile(rb"\bUID (\d+)")
_SIZE_ITEM = re.compile(rb"\bRFC822\.SIZE (\d+)")
_BODY_LITERAL = re.compile(rb"\bBODY\[\] \{\d+\}$")


def _uid_set(uids: list[int]) -> str:
    """`1:3,7,9:12`: a sorted UID list as IMAP ranges (a short command line for a long batch)."""
    ranges, start, previous = [], None, None
    for uid in sorted(set(uids)):
        if previous is not None and uid == previous + 1:
            previous = uid
            continue
        if start is not None:
            ranges.append(f"{start}:{previous}" if previous != start else str(start))
        start = previous = uid
    if start is not None:
        ranges.append(f"{start}:{previous}" if previous != start else str(start))
    return ",".join(ranges)


def _uid_fetch(client: IMAPClient, uids: list[int], items: str) -> list:
    typ, data = client._imap.uid("FETCH", _uid_set(uids), items)
    if typ != "OK":
        raise imap_errors.IMAPClientError(f"UID FETCH failed: {_text(data[0] if data else b'')}")
    return [item for item in data if item is not None]


def _fetch_sizes(client: IMAPClient, uids: list[int]) -> dict[int, int]:
    """{UID: RFC822.SIZE} of those of `uids` the server still has."""
    wanted, sizes = set(uids), {}
    for item in _uid_fetch(client, uids, "(RFC822.SIZE)"):
        line = item[0] if isinstance(item, tuple) else item
        uid, size = _UID_ITEM.search(line), _SIZE_ITEM.search(line)
        if uid and size and int(uid[1]) in wanted:
            sizes[int(uid[1])] = int(size[1])
    return sizes


def _fetch_bodies(client: IMAPClient, uids: list[int]) -> dict[int, bytes]:
    """{UID: the message's bytes} (BODY.PEEK[]: nothing set on the server) of those the server still has.

    Each message is a (line up to `BODY[] {n}`, literal) pair, its UID before the literal or in the rest of
    its line that follows; another FETCH the server volunteers (a flag change, no body) is no pair of ours."""
    wanted, bodies = set(uids), {}
    data = _uid_fetch(client, uids, "(BODY.PEEK[])")
    for index, item in enumerate(data):
        if not isinstance(item, tuple) or not _BODY_LITERAL.search(item[0]):
            continue
        uid = _UID_ITEM.search(item[0])
        if uid is None and index + 1 < len(data) and isinstance(data[index + 1], bytes):
            uid = _UID_ITEM.search(data[index + 1])
        if uid is not None and int(uid[1]) in wanted:
            bodies[int(uid[1])] = item[1]
    return bodies


def _fetched(raw: bytes, uid: int, history: bool) -> FetchedMessage:
    # The id and the thread key from one read of the header block.
    provider_message_id, thread_key = raw_message_keys(raw)
    return FetchedMessage(provider_message_id, raw, {"uid": uid}, history=history, thread_key=thread_key)


def _aware(value) -> datetime | None:
    """An INTERNALDATE as an aware datetime (imapclient gives naive local time by default)."""
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.astimezone()
