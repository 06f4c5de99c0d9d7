"""HTTP entry points of intake. Thin: verify, hand to `services.ingest`, answer.

Every webhook answer is JSON with `charset=utf-8` and `X-Content-Type-Options: nosniff`
(`webhook_json`; `intake.middleware.WebhookShortcutMiddleware` sees to the answers of
provider adapters too).
"""

import io
import logging

from django.conf import settings
from django.db import IntegrityError
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from . import health, selectors, services, signing
from .keys import raw_message_keys
from .models import Mailbox
from .secrets import SecretUnavailable, resolve_secret
from .vocabulary import WebhookRejection

logger = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
# Mailboxes seen signing with the deprecated v1 scheme (logged once per process and mailbox).
_v1_seen: set[str] = set()


def webhook_json(data: dict, status: int = 200) -> JsonResponse:
    """A webhook answer: JSON, its charset named, never sniffed as anything else."""
    response = JsonResponse(data, status=status, content_type=JSON_CONTENT_TYPE)
    response["X-Content-Type-Options"] = "nosniff"
    return response


def error_response(status: int, message: str) -> JsonResponse:
    return webhook_json({"error": message}, status=status)


def reject_request(provider: str, reason: WebhookRejection, status: int, message: str) -> JsonResponse:
    """A refused webhook: counted (`mailroom_webhook_rejections_total`), then answered."""
    services.count_webhook_rejection(provider, reason)
    return error_response(status, message)


BODY_PIECE_BYTES = 1 << 20


def read_body(request, limit: int) -> bytes | None:
    """The body, or None when it is larger than `limit` (read no further than that)."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    # In pieces into one buffer that becomes the bytes (io.BytesIO.getvalue): one read of the whole body
    # holds the server's buffer, its value and the slice returned at once.
    buffer = io.BytesIO()
    while piece := request.read(min(BODY_PIECE_BYTES, limit + 1 - buffer.tell())):
        buffer.write(piece)
        del piece
        if buffer.tell() > limit:
            return None
    return buffer.getvalue()


@csrf_exempt
@require_POST
def raw_webhook(request, mailbox_slug: str):
    mailbox = selectors.mailbox_by_slug(mailbox_slug)
    if mailbox is None or mailbox.provider != Mailbox.Provider.RAW:
        # Another provider's mailbox is "unknown" here, as on the provider webhook: its secret is that
        # provider's, never a key to a second way in.
        return reject_request("raw", WebhookRejection.UNKNOWN_MAILBOX, 404, "unknown mailbox")
    body = read_body(request, settings.MAILROOM_MAX_MESSAGE_BYTES)
    if body is None:
        return reject_request(
            "raw", WebhookRejection.TOO_LARGE, 413, f"message larger than {settings.MAILROOM_MAX_MESSAGE_BYTES} bytes"
        )
    try:
        secret = resolve_secret(mailbox.webhook_secret_ref, tenant=mailbox.tenant, owner=mailbox)
    except SecretUnavailable as exc:
        # Fail closed: without a secret nothing can be verified, so nothing is stored.
        logger.error("mailbox %s has no usable webhook secret: %s", mailbox.slug, exc)
        return reject_request("raw", WebhookRejection.NO_SECRET, 401, "signature cannot be verified")
    message_id = request.headers.get("X-Mailroom-Message-Id", "")
    try:
        scheme = signing.verify(
            secret,
            request.headers.get("X-Mailroom-Timestamp"),
            request.headers.get("X-Mailroom-Signature"),
            body,
            settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS,
            message_id=message_id,
        )
    except signing.SignatureError as exc:
        logger.warning("rejected webhook for mailbox %s: %s", mailbox.slug, exc)
        return reject_request("raw", WebhookRejection.BAD_SIGNATURE, 401, "invalid signature")
    if scheme != signing.V2 and mailbox.slug not in _v1_seen:
        _v1_seen.add(mailbox.slug)
        logger.warning("mailbox %s: raw webhook signed with the deprecated v1 scheme; sign with v2", mailbox.slug)
    if not body:
        return reject_request("raw", WebhookRejection.EMPTY_BODY, 400, "empty body: expected an RFC 5322 message")
    provider_message_id, thread_key = raw_message_keys(body, message_id)
    try:
        if scheme == signing.V1_UNSIGNED_ID:
            result = services.ingest_under_an_unsigned_id(mailbox, provider_message_id, body, thread_key=thread_key)
        else:
            result = services.ingest(mailbox, provider_message_id, body, source="raw", thread_key=thread_key)
    except IntegrityError:
        # The cached mailbox may have been deleted since (another process's cache lives a few seconds):
        # nothing was stored, so the answer is the one an unknown mailbox gets.
        selectors.forget_cached_mailboxes()
        if selectors.mailbox_by_slug(mailbox_slug) is not None:
            raise
        return reject_request("raw", WebhookRejection.UNKNOWN_MAILBOX, 404, "unknown mailbox")
    return webhook_json(
        {"inbox_event_id": result.inbox_event_id, "duplicate": result.duplicate},
        status=200 if result.duplicate else 202,
    )


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


@require_GET
def readyz(request):
    problems = health.readiness_problems()
    if problems:
        return JsonResponse({"ready": False, "problems": problems}, status=503)
    return JsonResponse({"ready": True})
