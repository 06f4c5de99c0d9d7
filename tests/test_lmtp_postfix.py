"""Acceptance: Postfix from the distribution delivering to `manage.py run_lmtp`, through an outage.

A private Postfix instance (tests.postfix) accepts mail for acme.test on its smtpd and relays it by
LMTP to the listener, which stores into the test database. 100 messages become 100 events. Then the
database is made unavailable to the listener for real (no new connections, its sessions cut): the
listener answers 451, Postfix keeps the messages in its deferred queue; once the database is back, a
queue flush delivers them all. No message is lost and none is stored twice: one event per Message-ID.

Over a unix socket (`run_lmtp --socket`, mode 660, group postfix: the set-up README recommends for one host),
Postfix delivers the same way, and nobody outside that group can open the socket.
"""

import os
import shutil
import smtplib
import stat
import uuid
from collections import Counter

from intake.models import InboxEvent
from tests.factories import email_message, make_mailbox, make_tenant
from tests.live import wait_for
from tests.postfix import database_outage, private_postfix, start_listener  # noqa: F401  (fixtures)
from tests.support.lmtp import unix_listener  # noqa: F401  (fixture)

FIRST_BATCH = 100
DURING_OUTAGE = 30


def submit(postfix, message_ids: list[str], to: str = "support@acme.test") -> None:
    """Hand the messages to Postfix's smtpd, as any sender would (one SMTP session)."""
    with smtplib.SMTP("127.0.0.1", postfix.smtpd_port, timeout=30) as client:
        for message_id in message_ids:
            raw = email_message(
                to=to,
                subject=f"Request {message_id}",
                message_id=f"<{message_id}>",
                body=f"Please help with {message_id}.\n",
            )
            assert client.sendmail("customer@example.com", [to], raw) == {}


def events_per_message_id(message_ids: list[str]) -> Counter:
    return Counter(
        InboxEvent.objects.filter(provider_message_id__in=message_ids).values_list("provider_message_id", flat=True)
    )


def test_postfix_delivers_every_message_once_through_a_database_outage(
    transactional_db, start_listener, private_postfix
):
    tenant = make_tenant(slug="acme")
    mailbox = make_mailbox(tenant, slug="support", address="support@acme.test")
    listener = start_listener()  # the shipped defaults (130 messages stay under 600 a minute from one client)
    postfix = private_postfix(listener.port, relay_domains=("acme.test",))
    run = uuid.uuid4().hex[:8]

    # 100 messages -> 100 events, one each.
    first = [f"first-{run}-{n}@sender.example" for n in range(FIRST_BATCH)]
    submit(postfix, first)
    wait_for(
        lambda: sum(events_per_message_id(first).values()) >= FIRST_BATCH,
        timeout=30,
        describe=lambda: f"{sum(events_per_message_id(first).values())} events\n{postfix.log()}",
    )
    assert events_per_message_id(first) == Counter({message_id: 1 for message_id in first})
    wait_for(lambda: postfix.queue() == [], timeout=10, describe=lambda: str(postfix.queue()))

    # The database goes away under the running listener: 451, and Postfix keeps every message.
    during = [f"outage-{run}-{n}@sender.example" for n in range(DURING_OUTAGE)]
    with database_outage(listener.application_name):
        submit(postfix, during)

        def all_deferred():
            queued = postfix.queue()
            return len(queued) == DURING_OUTAGE and all(m["queue_name"] == "deferred" for m in queued) and queued

        queued = wait_for(all_deferred, timeout=30, describe=lambda: f"{postfix.queue()}\n{postfix.log()}")
        reasons = {r["delay_reason"] for m in queued for r in m["recipients"]}
        assert reasons and all("451 4.3.0" in reason for reason in reasons), reasons
        assert events_per_message_id(during) == Counter()

    # Back: a queue flush delivers everything, once.
    postfix.flush()
    wait_for(
        lambda: sum(events_per_message_id(during).values()) >= DURING_OUTAGE,
        timeout=30,
        describe=lambda: f"{sum(events_per_message_id(during).values())} events\n{postfix.log()}",
    )
    wait_for(lambda: postfix.queue() == [], timeout=10, describe=lambda: str(postfix.queue()))
    assert events_per_message_id(during) == Counter({message_id: 1 for message_id in during})
    assert events_per_message_id(first) == Counter({message_id: 1 for message_id in first})
    assert InboxEvent.objects.filter(mailbox=mailbox).count() == FIRST_BATCH + DURING_OUTAGE
    assert set(InboxEvent.objects.values_list("source", flat=True)) == {"lmtp"}
    assert "status=bounced" not in postfix.log(lines=100_000)  # nothing was returned to a sender


def test_postfix_delivers_over_the_unix_socket(transactional_db, unix_listener, private_postfix):
    tenant = make_tenant(slug="acme")
    mailbox = make_mailbox(tenant, slug="support", address="support@acme.test")
    path, listener = unix_listener
    shutil.chown(path, group="postfix")  # 660: the listener's user and the mail server's group
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    postfix = private_postfix(0, relay_domains=("acme.test",), lmtp_host=str(path))
    run = uuid.uuid4().hex[:8]
    message_ids = [f"unix-{run}-{n}@sender.example" for n in range(20)]
    submit(postfix, message_ids)
    wait_for(
        lambda: sum(events_per_message_id(message_ids).values()) >= len(message_ids),
        timeout=30,
        describe=lambda: f"{sum(events_per_message_id(message_ids).values())} events\n{postfix.log()}",
    )
    wait_for(lambda: postfix.queue() == [], timeout=10, describe=lambda: str(postfix.queue()))
    assert events_per_message_id(message_ids) == Counter({message_id: 1 for message_id in message_ids})
    assert InboxEvent.objects.filter(mailbox=mailbox).count() == len(message_ids)
    log = postfix.log(lines=100_000)
    sent = [line for line in log.splitlines() if "status=sent (250 2.0.0 Delivered)" in line]
    assert len(sent) == len(message_ids) and all(f"[{path}]" in line for line in sent)  # relay=...[socket path]
    assert "status=bounced" not in log and "status=deferred" not in log
