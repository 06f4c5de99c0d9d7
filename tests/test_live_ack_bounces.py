"""A bounce of our own acknowledgment, through real processes: HTTP -> PostgreSQL -> relay -> Redis -> worker ->
a real SMTP server, and back.

A request is posted through the signed raw webhook; the real worker sends its acknowledgment to an aiosmtpd
server; the DSN a Postfix writes for that acknowledgment (message/delivery-status and text/rfc822-headers
with our Message-ID, built from what the server received) is posted through the webhook too. The original
event gets `acknowledgment_bounced`, the address is marked, and a second request from it is ticketed with
no acknowledgment (`address_bounced`), nothing more reaching the server.
"""

import time

import pytest
import requests
from aiosmtpd.controller import Controller

from intake.signing import signed_headers
from tests import bounce_mail
from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    free_port,
    live_broker,
    live_mailbox,
    live_processes,
    make_email,
    subprocess_env,
    wait_for,
)
from tests.senderauth import TRUSTED_AUTHSERV_ID, stamped
from tests.smtp_envelopes import Envelopes

pytestmark = pytest.mark.live

JANE = "jane@example.com"


def post(url: str, raw: bytes) -> int:
    response = requests.post(
        url, data=raw, timeout=30, headers={**signed_headers(LIVE_SECRET, raw), "Content-Type": "message/rfc822"}
    )
    assert response.status_code == 202, response.text
    return response.json()["inbox_event_id"]


def test_a_bounced_acknowledgment_is_tied_to_its_ticket_and_the_next_request_gets_no_email(
    live_server, live_mailbox, live_broker, live_processes
):
    from intake.models import AuditEvent, InboxEvent
    from ticketing.models import Intent, UndeliverableAddress

    live_mailbox.settings = {**live_mailbox.settings, "acknowledge": True, "trusted_authserv_id": TRUSTED_AUTHSERV_ID}
    live_mailbox.save()
    relay = Envelopes()
    smtp = Controller(relay, hostname="127.0.0.1", port=free_port())
    smtp.start()
    try:
        env = subprocess_env(live_broker.url, MAILROOM_CLAMD="off", EMAIL_URL=f"smtp://127.0.0.1:{smtp.port}")
        live_processes.worker(env)
        live_processes.relay(env)
        url = f"{live_server.url}/webhooks/raw/{live_mailbox.slug}/"

        original = post(url, stamped(make_email("Printer on fire", sender=JANE)))
        wait_for(lambda: relay.received, timeout=90, describe=lambda: live_processes.logs())
        [ack] = relay.received
        assert ack.rcpt_tos == [JANE]
        message_id = Intent.objects.get(inbox_event_id=original, action="notify_requester").result_ref
        assert message_id.encode() in ack.header_bytes()

        dsn = bounce_mail.postfix_dsn(ack.header_bytes(), JANE, mailbox=live_mailbox.address)
        bounce = post(url, dsn)
        tied = AuditEvent.objects.filter(inbox_event_id=original, kind="acknowledgment_bounced")
        wait_for(tied.exists, timeout=60, describe=lambda: live_processes.logs())
        [row] = tied
        assert (row.detail["bounce_event"], row.detail["status"], row.detail["action"]) == (bounce, "5.1.1", "failed")
        event = InboxEvent.objects.get(pk=bounce)
        assert (event.state, event.reason_code) == ("suppressed", "delivery_report")
        assert event.details["acknowledgment_bounce"]["event"] == original
        assert UndeliverableAddress.objects.filter(
            tenant=live_mailbox.tenant, address=JANE, bounced_event_id=bounce
        ).exists()

        second = post(url, stamped(make_email("Still on fire", sender=JANE)))
        skipped = AuditEvent.objects.filter(inbox_event_id=second, kind="acknowledgment_skipped")
        wait_for(skipped.exists, timeout=60, describe=lambda: live_processes.logs())
        assert InboxEvent.objects.get(pk=second).state == "completed"
        assert skipped.get().detail["reason"] == "address_bounced"
        assert not Intent.objects.filter(inbox_event_id=second, action="notify_requester").exists()
        time.sleep(1)  # anything sent for the second request would have reached the server by now
        assert len(relay.received) == 1
        assert tied.count() == 1
    finally:
        smtp.stop()
