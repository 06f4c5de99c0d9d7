"""`manage.py run_lmtp`, the mail server's delivery target, as a real process on the test database.

Driven by `smtplib.LMTP` / `smtplib.SMTP`: a 250 only once the event is committed, 4xx (never a 5xx)
for every failure of ours, 550 5.1.1 for recipients we do not have, per-recipient answers in LMTP,
the size limit announced and enforced, client limits, STARTTLS. Failures are real: a lock that holds
the insert, a trigger that makes the database refuse one mailbox's rows, a database that refuses
connections (tests.postfix.database_outage).

The edge (issue 20): idle connections from the mail server's own host cannot lock it out (at the cap the
idlest session makes room; idle ones time out), a slow-loris DATA is cut by the minimum rate and a DATA
that never ends by its deadline, and a unix socket (`--socket`) delivers end to end. Raw sockets play the
attacker; the figures are printed (`-s`). The tenant boundary over LMTP: tests/test_address_boundary.py.
"""

import datetime
import os
import select
import smtplib
import socket
import ssl
import stat
import threading
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client

from intake.models import AuditEvent, InboxEvent
from intake.signing import signed_headers
from tests.conftest import WEBHOOK_SECRET
from tests.factories import WEBHOOK_SECRET_VAR, email_message, make_mailbox, make_tenant
from tests.postfix import Listener, database_outage, lmtp_listener, start_listener, stop_listeners  # noqa: F401
from tests.support.lmtp import SENDER, lmtp, on_the_wire, send, unix_listener  # noqa: F401  (fixture)


@pytest.fixture
def acme(transactional_db, monkeypatch):
    """Tenant acme with mailboxes support@ and billing@ (committed: the listener is another process)."""
    monkeypatch.setenv(WEBHOOK_SECRET_VAR, WEBHOOK_SECRET)
    tenant = make_tenant(slug="acme")
    return {
        "support": make_mailbox(tenant, slug="support", address="Support@Acme.test"),
        "billing": make_mailbox(tenant, slug="billing", address="billing@acme.test"),
    }


@pytest.fixture
def refuse_rows_of():
    """`refuse_rows_of(mailbox)`: the database raises on every event insert for that mailbox (a trigger)."""
    created = []

    def refuse(mailbox):
        name = f"mailroom_test_refuse_{mailbox.pk}"
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION 'storage refused'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE INSERT ON {InboxEvent._meta.db_table} FOR EACH ROW "
                f"WHEN (NEW.mailbox_id = {int(mailbox.pk)}) EXECUTE FUNCTION {name}()"
            )
        created.append(name)
        return lambda: _drop_trigger(name, created)

    yield refuse
    for name in list(created):
        _drop_trigger(name, created)


def _drop_trigger(name: str, created: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {InboxEvent._meta.db_table}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")
    created.remove(name)


def events(**filters):
    return list(InboxEvent.objects.filter(**filters).order_by("pk"))


# --- one message, duplicates, unknown recipients -----------------------------------------------------


def test_one_message_is_one_event_stored_as_delivered_with_its_envelope(acme, lmtp_listener):
    raw = email_message(to="support@acme.test")
    client = lmtp(lmtp_listener)
    mail, rcpts, replies = send(client, ["support@acme.test"], raw)
    # The event is there the moment the 250 arrives: it was committed before the answer.
    stored = events()
    client.quit()
    assert mail[0] == 250 and rcpts == [(250, b"2.1.5 Recipient OK")]
    assert replies == [(250, b"2.0.0 Delivered")]
    assert len(stored) == 1
    event = stored[0]
    assert (event.mailbox_id, event.source, event.state) == (acme["support"].pk, "lmtp", "received")
    assert bytes(event.raw) == on_the_wire(raw)
    envelope = AuditEvent.objects.get(inbox_event=event, kind="provider_metadata")
    assert envelope.actor == "provider:lmtp"
    assert envelope.detail["envelope_from"] == SENDER
    assert envelope.detail["envelope_to"] == ["support@acme.test"]
    assert envelope.detail["client"] == "127.0.0.1" and envelope.detail["tls"] is False


def test_internationalized_mail_is_accepted_with_smtputf8(acme, lmtp_listener):
    raw = email_message(to="support@acme.test", sender="José <josé@exämple.test>", subject="Grüße")
    client = lmtp(lmtp_listener)
    assert client.has_extn("smtputf8") and client.has_extn("8bitmime")
    assert client.mail("josé@exämple.test", ["SMTPUTF8", "BODY=8BITMIME"])[0] == 250
    assert client.rcpt("support@acme.test")[0] == 250
    assert client.data(on_the_wire(raw)) == (250, b"2.0.0 Delivered")
    client.quit()
    detail = AuditEvent.objects.get(kind="provider_metadata").detail
    assert detail["envelope_from"] == "josé@exämple.test"


def test_answer_waits_for_the_commit(acme, lmtp_listener):
    """While the insert cannot commit (its table locked), no answer; the 250 comes after the commit."""
    raw = email_message(to="support@acme.test")
    client = lmtp(lmtp_listener)
    client.mail(SENDER)
    assert client.rcpt("support@acme.test")[0] == 250
    answers = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {InboxEvent._meta.db_table} IN SHARE MODE")
        sender = threading.Thread(target=lambda: answers.append(client.data(on_the_wire(raw))))
        sender.start()
        sender.join(1.5)
        assert sender.is_alive() and answers == []  # the listener is waiting on the database
        assert InboxEvent.objects.count() == 0
    sender.join(20)
    assert answers == [(250, b"2.0.0 Delivered")]
    assert InboxEvent.objects.count() == 1
    client.quit()


def test_duplicate_delivery_is_250_and_still_one_event(acme, lmtp_listener):
    raw = email_message(to="support@acme.test")
    client = lmtp(lmtp_listener)
    first = send(client, ["support@acme.test"], raw)[2]
    again = send(client, ["support@acme.test"], raw)[2]
    client.quit()
    assert first == [(250, b"2.0.0 Delivered")]
    assert again == [(250, b"2.0.0 Already delivered")]
    assert InboxEvent.objects.count() == 1
    assert AuditEvent.objects.filter(kind="provider_metadata").count() == 1


def test_unknown_recipients_are_550_and_nothing_is_stored(acme, lmtp_listener, count_rows):
    make_mailbox(acme["support"].tenant, slug="gmail-box", address="gmail-box@acme.test", provider="gmail")
    before = count_rows()
    client = lmtp(lmtp_listener)
    mail, rcpts, replies = send(
        client,
        ["nobody@acme.test", "gmail-box@acme.test", "support@elsewhere.test"],
        email_message(to="nobody@acme.test"),
    )
    assert client.docmd("DATA")[0] == 503  # no recipient accepted: no DATA
    client.quit()
    # Not ours, for good: 550 5.1.1 (a Gmail mailbox's own message ids are not Message-IDs: never a target).
    assert rcpts == [(550, b"5.1.1 No such mailbox here")] * 3
    assert replies == []
    assert count_rows() == before


def test_mixed_recipients_get_per_recipient_answers_and_one_event_per_mailbox(acme, lmtp_listener):
    raw = email_message(to="support@acme.test, billing@acme.test")
    client = lmtp(lmtp_listener)
    recipients = ["support@acme.test", "nobody@acme.test", "BILLING+invoices@acme.test", "SUPPORT@acme.test"]
    mail, rcpts, replies = send(client, recipients, raw)
    client.quit()
    assert [code for code, _ in rcpts] == [250, 550, 250, 250]  # case-insensitive, plus-addressing
    assert replies == [(250, b"2.0.0 Delivered")] * 3  # one per accepted recipient
    stored = events()
    assert sorted(e.mailbox_id for e in stored) == sorted([acme["support"].pk, acme["billing"].pk])
    assert {bytes(e.raw) for e in stored} == {on_the_wire(raw)}
    # Each event keeps its own mailbox's envelope recipients, never another mailbox's.
    envelope_to = {
        a.inbox_event.mailbox_id: a.detail["envelope_to"]
        for a in AuditEvent.objects.filter(kind="provider_metadata").select_related("inbox_event")
    }
    assert envelope_to == {
        acme["support"].pk: ["support@acme.test", "SUPPORT@acme.test"],
        acme["billing"].pk: ["BILLING+invoices@acme.test"],
    }
    # The listener's log names mailboxes and masked addresses: no full address, no body.
    log = lmtp_listener.log()
    assert "delivery to mailbox billing" in log and "n***@a***.test" in log
    for secret in ("nobody@acme.test", "support@acme.test", SENDER, "Please help"):
        assert secret not in log


def test_lmtp_answers_each_recipient_with_its_own_mailbox_outcome(acme, lmtp_listener, refuse_rows_of):
    raw = email_message(to="support@acme.test, billing@acme.test")
    allow_billing = refuse_rows_of(acme["billing"])
    client = lmtp(lmtp_listener)
    replies = send(client, ["support@acme.test", "billing@acme.test"], raw)[2]
    assert replies == [(250, b"2.0.0 Delivered"), (451, b"4.3.0 Temporary failure, please try again later")]
    assert [e.mailbox_id for e in events()] == [acme["support"].pk]

    allow_billing()
    # The mail server retries only the deferred recipient.
    assert send(client, ["billing@acme.test"], raw)[2] == [(250, b"2.0.0 Delivered")]
    client.quit()
    assert sorted(e.mailbox_id for e in events()) == sorted([acme["support"].pk, acme["billing"].pk])


def test_smtp_answers_once_and_only_250_when_every_mailbox_stored_it(acme, start_listener, refuse_rows_of):
    listener = start_listener("--smtp")
    raw = email_message(to="support@acme.test, billing@acme.test")
    allow_billing = refuse_rows_of(acme["billing"])
    client = smtplib.SMTP(listener.host, listener.port, timeout=20)
    client.ehlo("mta.example.test")
    assert client.has_extn("size")
    with pytest.raises(smtplib.SMTPDataError) as refused:
        client.sendmail(SENDER, ["support@acme.test", "billing@acme.test"], raw)
    assert (refused.value.smtp_code, refused.value.smtp_error) == (
        451,
        b"4.3.0 Temporary failure, please try again later",
    )
    assert [e.mailbox_id for e in events()] == [acme["support"].pk]

    allow_billing()
    assert client.sendmail(SENDER, ["support@acme.test", "billing@acme.test"], raw) == {}  # the whole retry
    client.quit()
    stored = events()
    assert sorted(e.mailbox_id for e in stored) == sorted([acme["support"].pk, acme["billing"].pk])
    assert {e.source for e in stored} == {"smtp"}


def test_message_received_by_webhook_and_by_lmtp_is_one_event(acme, lmtp_listener):
    raw = email_message(to="support@acme.test")
    response = Client().post(
        "/webhooks/raw/support/",
        data=raw,
        content_type="message/rfc822",
        **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed_headers(WEBHOOK_SECRET, raw).items()},
    )
    assert response.status_code == 202
    # As the mail server delivers it: its own Received header on top, CRLF line endings.
    delivered = (
        b"Received: from mx.example.test (mx.example.test [192.0.2.7])\r\n"
        b"\tby mta.acme.test (Postfix) with ESMTPS id 4XYZ; Mon, 04 Mar 2024 10:15:02 +0000\r\n" + on_the_wire(raw)
    )
    client = lmtp(lmtp_listener)
    replies = send(client, ["support@acme.test"], delivered)[2]
    client.quit()
    assert replies == [(250, b"2.0.0 Already delivered")]
    assert [(e.pk, e.source) for e in events()] == [(response.json()["inbox_event_id"], "raw")]


# --- size --------------------------------------------------------------------------------------------


def test_size_is_announced_and_enforced_at_mail_from_and_at_data(acme, start_listener, count_rows):
    listener = start_listener(env={"MAILROOM_MAX_MESSAGE_BYTES": "4000"})
    before = count_rows()
    client = lmtp(listener)
    assert client.esmtp_features["size"] == "4000"
    too_big = (552, b"5.3.4 Message size exceeds fixed maximum message size")
    assert client.mail(SENDER, ["SIZE=4001"]) == too_big
    # A client that declared nothing (or lied) is stopped at DATA: one answer per recipient in LMTP.
    big = email_message(to="support@acme.test", body="x" * 60 + ("\n" + "y" * 70) * 60)
    assert len(big) > 4000
    mail, rcpts, replies = send(client, ["support@acme.test", "billing@acme.test"], big)
    assert replies == [too_big, too_big]
    assert count_rows() == before
    # The session is still in step: a message within the limit goes through.
    assert send(client, ["support@acme.test"], email_message(to="support@acme.test"))[2] == [(250, b"2.0.0 Delivered")]
    client.quit()


# --- the database fails -----------------------------------------------------------------------------


def test_database_down_is_451_and_nothing_stored_then_250_when_it_is_back(acme, start_listener):
    listener = start_listener()
    raw = email_message(to="support@acme.test")
    client = lmtp(listener)
    assert send(client, ["billing@acme.test"], email_message(to="billing@acme.test"))[2][0][0] == 250  # connected
    temporary = (451, b"4.3.0 Temporary failure, please try again later")

    with database_outage(listener.application_name):
        # Recipient lookup fails: 451 at RCPT.
        assert send(client, ["support@acme.test"], raw)[1] == [temporary]
    # Accepted at RCPT, then the database goes away before the message is stored: 451 after DATA.
    client.mail(SENDER)
    assert client.rcpt("support@acme.test")[0] == 250
    with database_outage(listener.application_name):
        assert client.data(on_the_wire(raw)) == temporary
        assert InboxEvent.objects.filter(mailbox=acme["support"]).count() == 0

    # Back: the listener reconnects, and the mail server's retry is stored, once.
    assert send(client, ["support@acme.test"], raw)[2] == [(250, b"2.0.0 Delivered")]
    assert send(client, ["support@acme.test"], raw)[2] == [(250, b"2.0.0 Already delivered")]
    client.quit()
    assert InboxEvent.objects.filter(mailbox=acme["support"]).count() == 1
    assert "recipient lookup failed: database error" in listener.log()
    assert "delivery to mailbox support not stored: database error" in listener.log()


# --- limits per client ---------------------------------------------------------------------------------


def test_at_the_connection_cap_the_idlest_session_makes_room_and_only_busy_ones_refuse(
    acme, start_listener, count_rows
):
    listener = start_listener("--max-connections-per-client", "2", "--max-messages-per-minute", "3")
    first, second = lmtp(listener), lmtp(listener)
    assert second.noop()[0] == 250  # second is the more recently active
    third = lmtp(listener)  # the cap is reached: first, idle the longest, is closed to make room
    assert first.getreply() == (
        421,
        b"4.4.2 Idle connection closed: another connection from your address needed its place",
    )
    assert second.noop()[0] == 250 and third.noop()[0] == 250

    # Both sessions busy (their messages wait on the database): now a newcomer is refused, with a 4xx.
    raw = email_message(to="support@acme.test")
    for client in (second, third):
        assert client.mail(SENDER)[0] == 250 and client.rcpt("support@acme.test")[0] == 250
    answers = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {InboxEvent._meta.db_table} IN SHARE MODE")
        senders = [
            threading.Thread(target=lambda c=c: answers.append(c.data(on_the_wire(raw)))) for c in (second, third)
        ]
        for sender in senders:
            sender.start()
        time.sleep(1.0)  # both are storing, behind the lock
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            smtplib.LMTP(listener.host, listener.port, timeout=20)
        assert (refused.value.smtp_code, refused.value.smtp_error) == (
            421,
            b"4.7.0 Too many connections from your address, please try again later",
        )
    for sender in senders:
        sender.join(20)
    assert sorted(answers) == [(250, b"2.0.0 Already delivered"), (250, b"2.0.0 Delivered")]

    # The message rate: 2 messages so far, a third is fine, a fourth within the minute is deferred.
    assert send(second, ["support@acme.test"], email_message(to="support@acme.test"))[2] == [(250, b"2.0.0 Delivered")]
    before = count_rows()
    assert third.mail(SENDER) == (451, b"4.7.1 Too many messages from your address, please try again later")
    assert count_rows() == before
    second.quit()
    third.quit()


def idle_connection(listener) -> socket.socket:
    """A TCP session that reads the greeting and then says nothing (what an attacker on the MTA's host opens)."""
    sock = socket.create_connection((listener.host, listener.port), timeout=10)
    assert sock.recv(512).startswith(b"220")
    return sock


def read_until_closed(sock, timeout: float) -> bytes:
    """Everything the listener sends until it closes the connection (fails after `timeout` seconds)."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def closed_ones(socks, within: float) -> list[int]:
    """Indexes of the sockets the listener closed (EOF readable) within `within` seconds."""
    deadline = time.monotonic() + within
    closed = set()
    while time.monotonic() < deadline and len(closed) < len(socks):
        readable, _, _ = select.select([s for i, s in enumerate(socks) if i not in closed], [], [], 0.1)
        for sock in readable:
            read_until_closed(sock, 2)
            closed.add(socks.index(sock))
    return sorted(closed)


def test_idle_connections_from_the_mail_servers_host_do_not_lock_it_out(acme, start_listener):
    """Issue 20: 20 idle connections from 127.0.0.1 used to fill the per-client cap, and the MTA got 421.
    With the shipped defaults (20 per client, 30 s idle timeout), 25 idle ones cannot keep a delivery out."""
    listener = start_listener()
    idle = [idle_connection(listener) for _ in range(25)]
    started = time.monotonic()
    client = lmtp(listener)
    replies = send(client, ["support@acme.test"], email_message(to="support@acme.test"))[2]
    delivered_in = time.monotonic() - started
    client.quit()
    assert replies == [(250, b"2.0.0 Delivered")]
    assert delivered_in < 2.0, delivered_in
    # 25 idle + the delivery's session = 26 for a cap of 20: the 6 oldest idle ones made room, in order.
    assert closed_ones(idle, within=1.0) == list(range(6))
    print(
        f"\n25 idle connections from 127.0.0.1: a delivery got 250 {delivered_in * 1000:.0f} ms after it "
        f"connected; 6 idle sessions were closed to make room"
    )
    for sock in idle:
        sock.close()


def test_idle_sessions_and_half_sent_commands_are_closed_after_the_idle_timeout(acme, start_listener):
    listener = start_listener("--idle-timeout", "1")
    idle = [idle_connection(listener) for _ in range(20)]
    slow = idle_connection(listener)
    started = time.monotonic()
    for byte in b"LHLO mta.example.test":  # a command line dribbled out never completes a command
        if select.select([slow], [], [], 0.1)[0]:
            break  # the listener answered (and closed): stop sending
        slow.sendall(bytes([byte]))
    assert read_until_closed(slow, 5) == b"421 4.4.2 Timed out, closing connection\r\n"
    assert closed_ones(idle, within=3.0) == list(range(20))
    closed_after = time.monotonic() - started
    assert 0.9 <= closed_after < 3.0, closed_after
    print(f"\n--idle-timeout 1: 20 idle sessions and a dribbled command line closed within {closed_after:.1f} s")


def start_data(client) -> None:
    assert client.mail(SENDER)[0] == 250 and client.rcpt("support@acme.test")[0] == 250
    client.putcmd("data")
    assert client.getreply()[0] == 354


def dribble(client, chunk: bytes, every: float, limit: float) -> tuple[tuple[int, bytes], float]:
    """Send `chunk` every `every` seconds (never the final dot) until the listener answers; (answer, seconds)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if select.select([client.sock], [], [], every)[0]:
            return client.getreply(), time.monotonic() - started
        try:
            client.sock.sendall(chunk)
        except OSError:
            break
    return client.getreply(), time.monotonic() - started


def test_a_slow_loris_data_is_cut_and_nothing_is_stored(acme, start_listener, count_rows):
    listener = start_listener("--min-data-rate", "1000", "--data-grace", "1", "--data-timeout", "30")
    before = count_rows()
    client = lmtp(listener)
    start_data(client)
    answer, seconds = dribble(client, b"X-Slow: a\r\n", every=0.2, limit=10)  # 55 bytes/s
    assert answer == (421, b"4.4.2 Message data arriving too slowly, closing connection")
    assert 0.8 <= seconds < 2.5, seconds
    assert count_rows() == before
    print(f"\nslow-loris DATA at 55 B/s (minimum 1000 B/s over 1 s): cut after {seconds:.1f} s")
    # The listener serves the next session as usual.
    again = lmtp(listener)
    assert send(again, ["support@acme.test"], email_message(to="support@acme.test"))[2] == [(250, b"2.0.0 Delivered")]
    again.quit()


def test_data_that_never_ends_is_cut_at_the_deadline(acme, start_listener, count_rows):
    listener = start_listener("--data-timeout", "2", "--min-data-rate", "100", "--data-grace", "0.5")
    before = count_rows()
    client = lmtp(listener)
    start_data(client)
    answer, seconds = dribble(client, b"X-Steady: " + b"y" * 88 + b"\r\n", every=0.1, limit=10)  # ~1 kB/s
    assert answer == (421, b"4.4.2 Message data not completed in time, closing connection")
    assert 1.9 <= seconds < 3.5, seconds
    assert count_rows() == before
    print(f"\nDATA at ~1 kB/s that never ends (deadline 2 s): cut after {seconds:.1f} s")


# --- a unix socket ------------------------------------------------------------------------------------


def test_delivery_over_a_unix_socket_end_to_end(acme, unix_listener):
    path, listener = unix_listener
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    assert f"lmtp listening on unix:{path}" in listener.log()
    client = smtplib.LMTP(str(path), timeout=20)
    client.ehlo("mta.example.test")
    raw = email_message(to="support@acme.test")
    assert send(client, ["support@acme.test", "nobody@acme.test"], raw)[1:] == (
        [(250, b"2.1.5 Recipient OK"), (550, b"5.1.1 No such mailbox here")],
        [(250, b"2.0.0 Delivered")],
    )
    client.quit()
    event = InboxEvent.objects.get()
    assert (event.mailbox_id, event.source, bytes(event.raw)) == (acme["support"].pk, "lmtp", on_the_wire(raw))
    assert AuditEvent.objects.get(inbox_event=event, kind="provider_metadata").detail["client"] == "unix"

    # The socket is taken while the listener runs, and a path that is not a socket is never replaced.
    with pytest.raises(CommandError, match="another listener is running on this socket"):
        call_command("run_lmtp", socket=str(path))
    not_a_socket = path.parent / "file"
    not_a_socket.write_text("keep me")
    with pytest.raises(CommandError, match="exists and is not a socket"):
        call_command("run_lmtp", socket=str(not_a_socket))
    assert not_a_socket.read_text() == "keep me"

    listener.process.stop()
    assert not path.exists()  # removed at stop


# --- STARTTLS -----------------------------------------------------------------------------------------


@pytest.fixture
def self_signed_certificate(tmp_path):
    """(certificate path, key path) for 127.0.0.1 / lmtp.mailroom.test, made with `cryptography`."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lmtp.mailroom.test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("lmtp.mailroom.test"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "lmtp.crt", tmp_path / "lmtp.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


def test_starttls_with_a_configured_certificate_and_required_before_mail(acme, start_listener, self_signed_certificate):
    cert, key = self_signed_certificate
    listener = start_listener("--tls-cert", cert, "--tls-key", key, "--require-starttls")
    client = lmtp(listener)
    assert client.has_extn("starttls")
    assert client.mail(SENDER)[0] == 530  # must STARTTLS first
    client.starttls(context=ssl.create_default_context(cafile=cert))  # verifies the chain and 127.0.0.1
    assert client.sock.version().startswith("TLS")
    client.ehlo("mta.example.test")
    assert send(client, ["support@acme.test"], email_message(to="support@acme.test"))[2] == [(250, b"2.0.0 Delivered")]
    client.quit()
    event = InboxEvent.objects.get()
    assert AuditEvent.objects.get(inbox_event=event, kind="provider_metadata").detail["tls"] is True


# --- make run ---------------------------------------------------------------------------------------


def test_make_run_starts_the_listener_only_when_its_port_is_set(monkeypatch):
    from reconciliation.management.commands.run_stack import Command

    options = {"host": "127.0.0.1", "port": 8000, "web_workers": 1, "worker_concurrency": 1}
    monkeypatch.delenv("MAILROOM_LMTP_PORT", raising=False)
    assert "lmtp" not in Command()._commands(options)
    monkeypatch.setenv("MAILROOM_LMTP_PORT", "8024")
    assert Command()._commands(options)["lmtp"][-5:] == ["run_lmtp", "--host", "127.0.0.1", "--port", "8024"]
    monkeypatch.setenv("MAILROOM_LMTP_HOST", "0.0.0.0")
    assert Command()._commands(options)["lmtp"][-4:] == ["--host", "0.0.0.0", "--port", "8024"]
