"""What every destination reached over HTTP shares: one `requests` session without automatic retries,
behind the egress guard (`intake.egress`: every address checked as it is connected; a refusal is a
PermanentError configuration, nothing sent), tenant-scoped credentials, and the mapping of each HTTP
outcome to exactly one failure kind (marked with its status: "test connection" shows that, never a body).

A subclass says how it authenticates (`auth_for`), may answer a status of its own first
(`special_error`), and builds its payloads; the intent state machine decides what a failure
leads to (`ticketing.intents`). Nothing logged here carries a ticket body or a full address.

Every request of a destination with a quota waits for its slot in the budget all workers share
(`ticketing.budget`); a slot further away than the read timeout is not waited for: the call fails as
rate-limited, nothing sent, and is retried after that wait. A 429 or 503 with Retry-After is shared the
same way. A destination without a quota never asks the budget.
"""

import json
import logging
import time

import requests
from django.db import DatabaseError
from urllib3.exceptions import NewConnectionError

from intake.egress import EgressRefused, guarded_session
from intake.http import json_or_empty, parse_retry_after
from intake.logging import mask_address
from intake.secrets import SecretUnavailable, forget, resolve_secret
from intake.vocabulary import ReasonCode

from .. import budget
from .base import AmbiguousOutcome, DestinationAdapter, PermanentError, TransientError

log = logging.getLogger(__name__)

MAX_DETAIL_CHARS = 2000


class HttpDestination(DestinationAdapter):
    """A destination behind an HTTP API. `name` appears in logs and the User-Agent."""

    name = "http"
    # The statuses that are a validation failure of ours (never retried).
    invalid_statuses = (400, 422)

    def __init__(self, destination):
        super().__init__(destination)
        settings = destination.settings or {}
        self.settings = settings
        self.base_url = (destination.base_url or "").rstrip("/")
        self.timeout = (float(settings.get("connect_timeout", 3.05)), float(settings.get("read_timeout", 10)))
        # Every URL of a destination is the tenant's: through the egress guard (intake.egress), which checks
        # each address at connect time. No automatic retries: every retry is decided (and recorded) by the
        # intent state machine.
        self.session = guarded_session(purpose=f"destination {destination.slug or self.name}", max_retries=0)
        self.session.headers.update({"Accept": "application/json", "User-Agent": f"mailroom-{self.name}/1"})
        # The request budget shared by every worker (None: no quota, no budget query).
        self.quota = budget.quota_for(destination, self.capabilities)

    @property
    def retry_safe(self) -> bool:
        """Any write of this destination sent twice has the effect of one: it keeps our key. (An upsert
        makes only its create safe to repeat, not a comment: that call passes `retry_safe=True` itself.)"""
        return self.honours_idempotency_key

    # --- credentials --------------------------------------------------------

    def secret(self) -> str | None:
        """The resolved `credentials_ref` (None without one). Unavailable: a permanent failure (nothing sent)."""
        ref = self.destination.credentials_ref
        if not ref:
            return None
        try:
            # A destination belongs to a tenant (an unsaved one without it: platform references only).
            tenant = self.destination.tenant if self.destination.tenant_id else None
            return resolve_secret(ref, tenant=tenant, owner=self.destination)
        except SecretUnavailable as exc:
            raise PermanentError(ReasonCode.CREDENTIALS, str(exc)) from None

    def auth_for(self, secret: str | None):
        """(requests auth, extra headers) for a secret. Subclasses implement their scheme."""
        return None, {}

    def credentials_refused(self) -> None:
        """Called on a 401/403 before the one retry: forget what was cached (a token, the secret)."""
        forget(self.destination.credentials_ref)

    # --- one call -----------------------------------------------------------

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def send(
        self,
        method: str,
        path: str,
        *,
        write: bool,
        idempotency_key: str | None = None,
        idempotency_header: str = "Idempotency-Key",
        json_body=None,
        params=None,
        data=None,
        headers: dict | None = None,
        ok_statuses=range(200, 300),
        retry_safe: bool | None = None,
    ) -> requests.Response:
        """One HTTP call, no retries. Returns a response whose status is in `ok_statuses`, or raises one of
        the three failure kinds. Refused credentials are re-read once, and sent again only if they changed.
        `retry_safe`: this write sent twice has the effect of one (default: `self.retry_safe`)."""
        extra = dict(headers or {})
        if idempotency_key:
            extra[idempotency_header] = idempotency_key
        auth, auth_headers = self.auth_for(self.secret())
        for attempt in (1, 2):
            self.wait_for_budget()
            started = time.monotonic()
            try:
                response = self.session.request(
                    method,
                    self.url(path),
                    json=json_body,
                    params=params,
                    data=data,
                    headers={**extra, **auth_headers},
                    auth=auth,
                    timeout=self.timeout,
                    allow_redirects=False,
                )
            except EgressRefused as exc:
                raise egress_refusal(exc) from None
            except requests.RequestException as exc:
                raise self.network_error(exc, write) from exc
            log.debug(
                "%s: %s %s -> %s in %.0f ms",
                self.name,
                method,
                path.split("?")[0],
                response.status_code,
                (time.monotonic() - started) * 1000,
            )
            if response.status_code in ok_statuses:
                return response
            self.note_retry_after(response)
            if response.status_code in (401, 403) and attempt == 1 and self.destination.credentials_ref:
                log.info(
                    "%s: HTTP %s; re-reading %s once", self.name, response.status_code, self.destination.credentials_ref
                )
                self.credentials_refused()
                fresh = self.auth_for(self.secret())
                if fresh != (auth, auth_headers):
                    auth, auth_headers = fresh
                    continue
            break
        raise self.http_error(response, write, self.retry_safe if retry_safe is None else retry_safe)

    # --- the shared request budget (ticketing.budget) --------------------------

    def wait_for_budget(self) -> None:
        """Wait for this request's slot; one further away than the read timeout is a rate-limited failure
        (nothing sent), retried by the intent state machine after that wait."""
        if self.quota is None:
            return
        try:
            wait = budget.take(self.destination, quota=self.quota, max_wait=self.timeout[1])
        except budget.OverBudget as exc:
            raise TransientError(
                ReasonCode.RATE_LIMITED, f"request budget spent for {exc.wait:.1f} s", retry_after=exc.wait
            ) from None
        except DatabaseError as exc:
            # The budget only spares the desk's 429s, which stay handled: without it the call still goes.
            log.warning("%s: request budget unavailable (%s); sending without it", self.name, type(exc).__name__)
            return
        if wait > 0:
            time.sleep(wait)

    def note_retry_after(self, response: requests.Response) -> None:
        """A 429, or a 503 that names a Retry-After: every worker waits it out."""
        if self.quota is None or response.status_code not in (429, 503):
            return
        seconds = parse_retry_after(response.headers.get("Retry-After"))
        if not seconds:
            return
        try:
            budget.note_retry_after(self.destination, seconds, quota=self.quota)
        except DatabaseError as exc:
            log.warning("%s: request budget unavailable (%s); Retry-After not shared", self.name, type(exc).__name__)
        else:
            log.info(
                "%s: HTTP %s, Retry-After %.0f s: every worker waits it out", self.name, response.status_code, seconds
            )

    # --- error mapping ------------------------------------------------------

    def network_error(self, exc: requests.RequestException, write: bool):
        if isinstance(
            exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema)
        ):
            return PermanentError(ReasonCode.CONFIGURATION, f"bad base_url: {type(exc).__name__}")
        if nothing_sent(exc):
            return TransientError(ReasonCode.CONNECTION, type(exc).__name__)
        reason = ReasonCode.TIMEOUT if isinstance(exc, requests.exceptions.Timeout) else ReasonCode.CONNECTION_LOST
        if not write:
            return TransientError(reason, type(exc).__name__)  # a read that failed changed nothing
        # The request went out; whether the destination acted on it is unknown (`resolve_unknown` decides
        # from the capabilities whether sending it again is safe).
        return AmbiguousOutcome(reason, type(exc).__name__)

    def special_error(self, response: requests.Response, body: dict, write: bool):
        """A subclass's own reading of a status (or None to use the common table)."""
        return None

    def http_error(self, response: requests.Response, write: bool, retry_safe: bool | None = None):
        """The failure a response means, marked with its status (`answered_with`): its detail may quote the
        body, which "test connection" never shows."""
        return answered_with(self.mapped_error(response, write, retry_safe), response.status_code)

    def mapped_error(self, response: requests.Response, write: bool, retry_safe: bool | None = None):
        status = response.status_code
        retry_safe = self.retry_safe if retry_safe is None else retry_safe
        body = json_or_empty(response)
        special = self.special_error(response, body, write)
        if special is not None:
            return special
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if status == 429:
            return TransientError(ReasonCode.RATE_LIMITED, f"HTTP {status}", retry_after=retry_after)
        if status == 503 and retry_after is not None:
            return TransientError(ReasonCode.UNAVAILABLE, f"HTTP {status}", retry_after=retry_after)
        if status in (401, 403):
            return PermanentError(ReasonCode.CREDENTIALS, f"HTTP {status}")
        if status in self.invalid_statuses:
            return PermanentError(ReasonCode.INVALID_FIELDS, field_errors(body, status))
        if status == 409:
            return TransientError(ReasonCode.CONFLICT, f"HTTP {status}", retry_after=retry_after)
        if status >= 500:
            # A 5xx may come after the write. Where a second write is harmless, retry; else only a lookup knows.
            if not write or retry_safe:
                return TransientError(ReasonCode.SERVER_ERROR, f"HTTP {status}", retry_after=retry_after)
            return AmbiguousOutcome(ReasonCode.SERVER_ERROR, f"HTTP {status}")
        if status == 404:
            return PermanentError(ReasonCode.NOT_FOUND, f"HTTP {status}")
        return PermanentError(ReasonCode.REJECTED, f"HTTP {status}")


def egress_refusal(exc: EgressRefused) -> PermanentError:
    """A URL the egress guard refused: nothing was sent, and a retry cannot help (an admin must fix the URL)."""
    return PermanentError(ReasonCode.CONFIGURATION, str(exc))


def answered_with(error, status: int):
    """`error`, marked as the reading of an HTTP answer with `status` (its detail may quote the body)."""
    error.http_status = status
    return error


def nothing_sent(exc: requests.RequestException) -> bool:
    """Did the call fail before a byte of the request left? (refused, unresolvable, connect timeout)"""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(exc, requests.exceptions.SSLError):
        return True  # the TLS handshake comes before the request
    if isinstance(exc, requests.exceptions.ConnectionError):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return isinstance(reason, NewConnectionError)  # includes NameResolutionError
    return False


def json_object(response: requests.Response, write: bool) -> dict:
    """The body as a JSON object. Anything else after a write is ambiguous (it answered 2xx: the record
    probably exists); after a read, transient."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if write:
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code}, body is not JSON")
        raise TransientError(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code}, body is not JSON")
    return body


def field_errors(body, status: int) -> str:
    """The destination's field errors, kept as JSON for the operator; addresses masked, size capped."""
    errors = (body.get("details") if isinstance(body, dict) else None) or body or {"status": status}
    return mask_address(json.dumps(errors, sort_keys=True))[:MAX_DETAIL_CHARS]
