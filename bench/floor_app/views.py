"""The floor's two URLs: POST /webhooks/raw/<slug>/ (HMAC check + one INSERT statement) and /healthz.

The insert writes the app's own three rows (event, `received` audit row, outbox row) and the
relay's NOTIFY as one statement into the app's tables, like intake.services._INGEST_SQL, so the
floor pays the same PostgreSQL cost; what it skips is everything Django-side the app does around it.
"""

import hashlib
import hmac
import os
import re
import time

from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils import timezone

SECRET = os.environ["BENCH_SECRET"].encode()
TENANT = int(os.environ["FLOOR_TENANT"])
MAILBOX = int(os.environ["FLOOR_MAILBOX"])
TOLERANCE = 300
_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*<?([^>\r\n]+)>?", re.IGNORECASE | re.MULTILINE)

INSERT = """
WITH event AS (
    INSERT INTO intake_inboxevent (tenant_id, mailbox_id, provider_message_id, dedupe_key, source, state,
                         reason_code, reason_detail, received_at, updated_at, raw, size, message_id_header,
                         sender, subject, thread_key, dispatch_count, auth_results, details, route_override,
                         route, fingerprint, message_id_reused)
    VALUES (%(tenant)s, %(mailbox)s, %(pmid)s, %(key)s, 'raw', 'received', '', '', %(now)s, %(now)s,
            %(raw)s, %(size)s, '', '', '', %(pmid)s, 1, '{}', '{}', '{}', '{}', %(fingerprint)s, false)
    ON CONFLICT DO NOTHING
    RETURNING id
), audit AS (
    INSERT INTO intake_auditevent (inbox_event_id, actor, kind, detail, at)
    SELECT id, 'provider:raw', 'received', %(detail)s::jsonb, %(now)s FROM event
), outbox AS (
    INSERT INTO intake_outboxmessage (topic, payload, created_at, attempts)
    SELECT 'inbox_event.process', jsonb_build_object('inbox_event_id', id), %(now)s, 0 FROM event
)
SELECT id, pg_notify('mailroom_outbox', '') FROM event
"""


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


def webhook(request, slug):
    if request.method != "POST":
        return HttpResponse(status=405)
    body = request.body
    timestamp = request.headers.get("X-Mailroom-Timestamp") or ""
    signature = request.headers.get("X-Mailroom-Signature") or ""
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > TOLERANCE:
        return JsonResponse({"error": "invalid signature"}, status=401)
    expected = "v1=" + hmac.new(SECRET, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return JsonResponse({"error": "invalid signature"}, status=401)
    found = _MESSAGE_ID.search(body, 0, body.find(b"\r\n\r\n"))
    pmid = found.group(1).decode(errors="replace") if found else hashlib.sha256(body).hexdigest()
    key = hashlib.sha256(f"{TENANT}:{MAILBOX}:{pmid}:ingest".encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute(
            INSERT,
            {
                "tenant": TENANT,
                "mailbox": MAILBOX,
                "pmid": pmid,
                "key": key,
                "now": timezone.now(),
                "raw": body,
                "size": len(body),
                "fingerprint": hashlib.sha256(body).hexdigest(),
                "detail": f'{{"size": {len(body)}}}',
            },
        )
        row = cursor.fetchone()
    if row is None:
        return JsonResponse({"inbox_event_id": None, "duplicate": True}, status=200)
    return JsonResponse({"inbox_event_id": row[0], "duplicate": False}, status=202)


urlpatterns = [path("webhooks/raw/<slug:slug>/", webhook), path("healthz", healthz)]
