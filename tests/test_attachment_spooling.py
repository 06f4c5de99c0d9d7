"""Large attachments are decoded from the raw message into spooled temporary files, scanned and sent from
there (intake.mime.spool): byte-identical, hashed the same, on disk above the threshold, gone afterwards."""

import base64
import email
import hashlib
import http.server
import os
import tempfile
import threading
import tracemalloc
from email import policy

import pytest
import requests

from intake.mime import attachment_file, iter_attachment_files, iter_attachment_payloads, parse_message
from intake.scanning import ClamdClient
from tests.clamd import EICAR, EICAR_SIGNATURE

MiB = 1024 * 1024


def _lines(data: bytes) -> str:
    return base64.encodebytes(data).decode().replace("\n", "\r\n")


def two_attachment_message(
    pdf: bytes, photo: bytes, photo_name: str = "site-photo.jpg", photo_type: str = "image/jpeg"
) -> bytes:
    """As Thunderbird writes a message with a text body and two attachments (base64, 76-character lines)."""
    return (
        "From: Big Sender <big.sender@example.com>\r\nTo: support@example.test\r\n"
        "Subject: contract and photo\r\nDate: Mon, 06 Jan 2025 10:00:00 +0000\r\n"
        "Message-ID: <spool-1@example.com>\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/mixed; boundary="------------b1"\r\n\r\n'
        "This is a multi-part message in MIME format.\r\n"
        "--------------b1\r\nContent-Type: text/plain; charset=UTF-8; format=flowed\r\n"
        "Content-Transfer-Encoding: 7bit\r\n\r\nHello, the signed contract and a photo are attached.\r\n\r\n"
        '--------------b1\r\nContent-Type: application/pdf; name="contract.pdf"\r\n'
        'Content-Disposition: attachment; filename="contract.pdf"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
        + _lines(pdf)
        + f'--------------b1\r\nContent-Type: {photo_type}; name="{photo_name}"\r\n'
        f'Content-Disposition: attachment; filename="{photo_name}"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
        + _lines(photo)
        + "\r\n--------------b1--\r\n"
    ).encode()


def blobs(total: int) -> tuple[bytes, bytes]:
    pdf = b"%PDF-1.7\n" + os.urandom(total * 3 // 5) + b"\n%%EOF\n"
    photo = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + os.urandom(total * 2 // 5 - 3)
    return pdf, photo


def open_spools(directory) -> list[str]:
    """This process's open files in `directory` (an unnamed temporary file shows as "<dir>/#<n> (deleted)")."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


class _Desk(http.server.BaseHTTPRequestHandler):
    """A desk's upload endpoint: keeps each multipart body it is sent."""

    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.headers["Content-Type"], body))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"id": 1}')

    def log_message(self, *args):
        pass


@pytest.fixture
def desk():
    _Desk.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Desk)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/api/uploads", _Desk.received
    server.shutdown()
    server.server_close()


@pytest.fixture
def spool_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where tempfile puts spool files, for this test
    return tmp_path


def test_a_5_mb_two_attachment_message_is_scanned_and_delivered_byte_identical_from_spool_files(clamd, desk, spool_dir):
    pdf, photo = blobs(5 * MiB)
    raw = two_attachment_message(pdf, photo)
    parsed = parse_message(raw)
    assert [(a.filename, a.sniffed_type, a.size, a.sha256) for a in parsed.attachments] == [
        ("contract.pdf", "application/pdf", len(pdf), hashlib.sha256(pdf).hexdigest()),
        ("site-photo.jpg", "image/jpeg", len(photo), hashlib.sha256(photo).hexdigest()),
    ]
    assert parsed.text.startswith("Hello, the signed contract")

    client = ClamdClient(clamd.tcp_address)
    seen = []
    for attachment, file in iter_attachment_files(parsed, spool_threshold=MiB):
        seen.append((attachment.filename, len(open_spools(spool_dir))))
        assert client.scan(file).clean
    assert seen == [("contract.pdf", 1), ("site-photo.jpg", 1)]  # one spool file at a time, on disk
    assert open_spools(spool_dir) == []

    url, received = desk
    for index, attachment in enumerate(parsed.attachments):
        with attachment_file(parsed, index, spool_threshold=MiB) as file:
            answer = requests.post(
                url, files={"file": (attachment.filename, file, attachment.sniffed_type)}, timeout=30
            )
        assert answer.status_code == 201
    assert open_spools(spool_dir) == [] and os.listdir(spool_dir) == []
    arrived = []
    for content_type, body in received:
        form = email.message_from_bytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body, policy=policy.default)
        (part,) = form.iter_parts()
        arrived.append((part.get_filename(), part.get_content_type(), part.get_payload(decode=True)))
    assert arrived == [("contract.pdf", "application/pdf", pdf), ("site-photo.jpg", "image/jpeg", photo)]
    assert [hashlib.sha256(data).hexdigest() for _, _, data in arrived] == [a.sha256 for a in parsed.attachments]


def test_eicar_in_the_second_attachment_is_found_from_its_spool_file(clamd, spool_dir):
    pdf, _ = blobs(2 * MiB)
    parsed = parse_message(
        two_attachment_message(
            pdf, EICAR + b" " * (200 * 1024), photo_name="readme.txt", photo_type="text/plain; charset=us-ascii"
        )
    )
    client = ClamdClient(clamd.tcp_address)
    verdicts = [
        (a.filename, client.scan(file), len(open_spools(spool_dir)))
        for a, file in iter_attachment_files(parsed, spool_threshold=1024)
    ]
    assert [(name, result.clean, result.signature, spools) for name, result, spools in verdicts] == [
        ("contract.pdf", True, None, 1),
        ("readme.txt", False, EICAR_SIGNATURE, 1),
    ]  # each scanned from disk
    assert open_spools(spool_dir) == []


def test_a_part_above_the_threshold_is_never_held_whole_while_spooled():
    pdf, photo = blobs(8 * MiB)
    raw = two_attachment_message(pdf, photo)
    tracemalloc.start()
    try:
        parsed = parse_message(raw)
        parse_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        digests = []
        for _attachment, file in iter_attachment_files(parsed, spool_threshold=MiB):
            hasher = hashlib.sha256()
            while chunk := file.read(64 * 1024):
                hasher.update(chunk)
            digests.append(hasher.hexdigest())
        spool_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        whole = [hashlib.sha256(data).hexdigest() for _, data in iter_attachment_payloads(parsed)]
        whole_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert digests == whole == [hashlib.sha256(pdf).hexdigest(), hashlib.sha256(photo).hexdigest()]
    assert parse_peak < len(raw) // 4  # the parsed message holds no copy of the encoded parts
    assert spool_peak < 2 * MiB  # the threshold's worth in memory, then a block at a time to disk
    assert whole_peak >= len(pdf)  # what iter_attachment_payloads costs, for comparison


@pytest.mark.parametrize("case", ["text_part", "inside_attached_message", "quoted_printable_neighbour"])
def test_messages_the_shortcut_does_not_fit_parse_as_the_email_package_reads_them(case):
    """A long base64-looking run that is not a base64 file part: parsed the ordinary way, same results."""
    data = os.urandom(300 * 1024)
    body = _lines(data)
    if case == "text_part":  # base64 pasted into a plain text body, not encoded
        part = f"Content-Type: text/plain; charset=us-ascii\r\n\r\n{body}"
    elif case == "inside_attached_message":
        part = (
            "Content-Type: message/rfc822\r\n\r\nFrom: a@example.com\r\nSubject: inner\r\nMIME-Version: 1.0\r\n"
            'Content-Type: application/pdf; name="inner.pdf"\r\nContent-Transfer-Encoding: base64\r\n\r\n' + body
        )
    else:
        part = (
            'Content-Type: application/octet-stream; name="data.bin"\r\n'
            "Content-Transfer-Encoding: base64\r\n\r\n" + body + "trailing words, not base64\r\n"
        )
    raw = (
        "From: a@example.com\r\nTo: b@example.test\r\nSubject: s\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/mixed; boundary="B"\r\n\r\n--B\r\nContent-Type: text/plain\r\n\r\nhi\r\n'
        f"--B\r\n{part}\r\n--B--\r\n"
    ).encode()
    parsed = parse_message(raw)
    expected = email.message_from_bytes(raw, policy=policy.default)
    leaves = [p for p in expected.walk() if not p.is_multipart()]
    if case == "text_part":
        assert body.replace("\r\n", "\n").strip()[:1000] in parsed.text
    else:
        stdlib = leaves[-1].get_payload(decode=True)
        payloads = dict((a.filename, d) for a, d in iter_attachment_payloads(parsed))
        name = "inner.pdf" if case == "inside_attached_message" else "data.bin"
        assert payloads[name] == stdlib
        assert [a.sha256 for a in parsed.attachments if a.filename == name] == [hashlib.sha256(stdlib).hexdigest()]


def test_the_stored_message_read_a_mib_at_a_time_is_the_stored_message(mailbox):
    from intake.models import InboxEvent
    from intake.rawload import CHUNK_BYTES, raw_message
    from tests.factories import make_event

    pdf, photo = blobs(3 * CHUNK_BYTES)
    event = make_event(mailbox, two_attachment_message(pdf, photo))
    stored = InboxEvent.objects.values_list("raw", flat=True).get(pk=event.pk)
    assert len(stored) > 3 * CHUNK_BYTES and len(stored) % CHUNK_BYTES
    assert raw_message(event.pk) == stored
    InboxEvent.objects.filter(pk=event.pk).update(raw=None)  # purged by retention
    assert raw_message(event.pk) is None
    assert raw_message(event.pk + 1000) is None


def test_normalize_reads_a_deferred_message_itself_and_quarantines_eicar_in_the_second_file(
    mailbox, settings, clamd, spool_dir
):
    from intake.models import InboxEvent
    from intake.normalize import normalize
    from tests.factories import make_event

    settings.MAILROOM_CLAMD = clamd.tcp_address
    settings.MAILROOM_SPOOL_THRESHOLD_BYTES = 64 * 1024
    pdf, _ = blobs(2 * MiB)
    raw = two_attachment_message(
        pdf, EICAR + b"\n" * (300 * 1024), photo_name="notes.txt", photo_type="text/plain; charset=us-ascii"
    )
    event = make_event(mailbox, raw)
    deferred = InboxEvent.objects.select_related("mailbox").defer("raw").get(pk=event.pk)
    outcome = normalize(deferred, actor="test")
    assert outcome.state == InboxEvent.State.QUARANTINED
    assert deferred.raw == raw
    stored = InboxEvent.objects.get(pk=event.pk)
    assert stored.state == InboxEvent.State.QUARANTINED
    assert [f["detail"].split(":", 1)[0] for f in stored.details["findings"] if f["reason"] == "malware"] == [
        "notes.txt"
    ]
    assert [(a["filename"], a["size"]) for a in stored.details["attachments"]] == [
        ("contract.pdf", len(pdf)),
        ("notes.txt", len(EICAR) + 300 * 1024),
    ]
    assert open_spools(spool_dir) == [] and os.listdir(spool_dir) == []


def test_the_worker_load_brings_small_messages_with_the_row_and_leaves_large_ones_to_be_read_in_pieces(
    mailbox, settings, django_assert_num_queries
):
    from intake.models import InboxEvent
    from intake.rawload import CHUNK_BYTES, load_raw, with_small_raw
    from tests.factories import make_event

    settings.MAILROOM_SPOOL_THRESHOLD_BYTES = 64 * 1024
    small = make_event(mailbox, subject="small")
    pdf, photo = blobs(CHUNK_BYTES)
    large = make_event(mailbox, two_attachment_message(pdf, photo))
    stored = dict(InboxEvent.objects.values_list("pk", "raw"))
    with django_assert_num_queries(1):
        events = {e.pk: e for e in with_small_raw(InboxEvent.objects.filter(pk__in=[small.pk, large.pk]))}
        load_raw(events[small.pk])  # came with the row
    assert events[small.pk].raw == stored[small.pk]
    assert events[large.pk].small_raw is None and "raw" in events[large.pk].get_deferred_fields()
    load_raw(events[large.pk])  # its size, then a MiB at a time
    assert events[large.pk].raw == stored[large.pk]
