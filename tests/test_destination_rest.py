"""The generic REST adapter against FakeDesk's rest dialect over real HTTP: templates rendered as safe JSON,
declared capabilities (and none declared), lookups, check_connection, settings validation.

What every kind shares (duplicates, lost answers, 429/401/422, comments through the pipeline) is in
tests/test_destination_contract.py."""

import base64
import hashlib
import json
import logging
import time
from collections import Counter

import pytest
import requests

from tests.destination_kits import only_record, rest as kit
from tests.factories import make_destination
from ticketing.destinations import adapter_for
from ticketing.destinations.base import (
    AmbiguousOutcome,
    CommentRequest,
    OutgoingFile,
    PermanentError,
    TicketClosed,
    TicketRequest,
    TransientError,
)
from ticketing.destinations.files import attach_each
from ticketing.destinations.rest import RestDestination
from ticketing.destinations.settings import validate
from ticketing.models import Destination

pytestmark = pytest.mark.fakedesk(dialect="rest")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email", "billing"),
    queue="billing",
    priority="urgent",
    request_type="refund",
    assignee="alice",
)
PLAIN = {
    "create_url": "/records",
    "body_template": kit.BODY_TEMPLATE,
    "id_path": "data.id",
    "headers": {"Authorization": "Bearer {secret}"},
}


@pytest.fixture
def rest(tenant, desk, monkeypatch):
    """build(**settings) -> an adapter with the kit's declarations; plain(**settings) -> only PLAIN's."""
    made = []

    def build(**settings):
        made.append(kit.configure(tenant, desk, monkeypatch, slug=f"rest-{len(made)}", **settings))
        return adapter_for(made[-1])

    def plain(**settings):
        # The kit's token variable, under a destination that declares nothing else.
        build()
        destination = make_destination(
            tenant,
            slug=f"plain-{len(made)}",
            kind="rest",
            is_default=False,
            base_url=desk.url,
            credentials_ref=made[-1].credentials_ref,
            settings={"read_timeout": 1.0, **PLAIN, **settings},
        )
        return adapter_for(destination)

    build.plain = plain
    return build


@pytest.fixture
def seen(desk):
    requests_seen = []
    desk.on_request(lambda request: requests_seen.append(request) and None)
    return requests_seen


# --- The body it sends ------------------------------------------------------------------


def test_create_renders_the_template_maps_the_route_and_reads_the_id(desk, rest, seen):
    result = rest().create_ticket(REQUEST, "key-1", "evt-1")

    assert result.ticket_id == "1"
    assert result.url == f"{desk.url}/records/1"
    [create] = seen
    assert (create.method, create.path) == ("POST", "/records")
    assert create.headers["Authorization"] == f"Bearer {desk.token}"
    assert create.headers["Idempotency-Key"] == "key-1"
    assert create.json() == {
        "queue": "Billing",
        "priority": "P1",
        "type": "refund-request",
        "assignee": "agent-alice",
        "subject": "Invoice 42 charged twice",
        "description": "I was charged twice.",
        "requester": {"email": "jane.doe@example.com", "name": "Jane Doe"},
        "cc": [],
        "tags": ["email", "billing"],
        "attachments": [],
        "external_ref": "evt-1",
    }


def test_a_word_the_mapping_lacks_is_left_out_and_without_a_mapping_the_word_goes(desk, rest, seen):
    request = TicketRequest(
        subject="s",
        description="d",
        requester="jane@example.com",
        queue="sales",
        priority="low",
        fields={"priority": "custom", "source": "mail"},
    )
    rest().create_ticket(request, "key-1", "evt-1")
    rest(priorities=None, queues=None).create_ticket(request, "key-2", "evt-2")

    first, second = (r.json() for r in seen)
    assert "queue" not in first and first["priority"] == "custom" and first["source"] == "mail"  # fields win
    assert second["queue"] == "sales"


@pytest.mark.parametrize(
    "subject",
    [
        'He said "refund" \\ now',
        "line one\nline two\r\n\ttabbed \x1b escape",
        '{{ subject }} {% if x %}{% endif %} {"injected": true}',
        "</script><script>alert(1)</script> & <b>",
        "Ünïcödé — 日本語 🎉 \u2028 \u202e",
        '", "external_ref": "forged',
    ],
)
def test_hostile_subjects_come_out_as_valid_json_that_round_trips(desk, rest, seen, subject):
    request = TicketRequest(
        subject=subject, description=subject + "\n-- body", requester=r'"O\"Brien \\ Q" <q@example.com>'
    )
    rest().create_ticket(request, "key-1", "evt-1")

    sent = json.loads(seen[0].body)  # what went over the wire parses...
    assert (sent["subject"], sent["description"]) == (subject, subject + "\n-- body")  # ...and round-trips
    assert sent["external_ref"] == "evt-1"
    assert sent["requester"] == {"email": "q@example.com", "name": 'O"Brien \\ Q'}
    assert only_record(desk)["subject"] == subject


def test_a_template_that_renders_invalid_json_is_configuration_and_nothing_is_sent(desk, rest, seen):
    adapter = rest(body_template='{ {% if queue %}"queue": "{{ queue }}",{% endif %} }')  # a trailing comma
    with pytest.raises(PermanentError) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "configuration"
    assert "did not render valid JSON" in caught.value.detail
    assert "Billing" not in caught.value.detail  # no values in the message
    assert seen == [] and desk.requests_log() == []


# --- Declared capabilities -------------------------------------------------------------------


def test_with_nothing_declared_a_lost_answer_is_ambiguous_and_every_flag_is_off(desk, rest, seen):
    adapter = rest.plain()
    assert (
        adapter.honours_idempotency_key,
        adapter.idempotency_window_seconds,
        adapter.upsert,
        adapter.consistent_lookup,
        adapter.lookup_settle_seconds,
        adapter.retry_safe,
    ) == (False, None, False, False, None, False)
    desk.set_plan(["drop_after_commit", "error_500"])

    with pytest.raises(AmbiguousOutcome) as dropped:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert dropped.value.reason == "connection_lost"
    with pytest.raises(AmbiguousOutcome) as failed:  # a 5xx is no safer
        adapter.create_ticket(REQUEST, "key-2", "evt-2")
    assert failed.value.reason == "server_error"
    assert "Idempotency-Key" not in seen[0].headers
    with pytest.raises(NotImplementedError):
        adapter.find_by_external_ref("evt-1")
    with pytest.raises(PermanentError) as unchecked:
        adapter.check_connection()
    assert (unchecked.value.reason, unchecked.value.detail) == (
        "configuration",
        "declare check_url (a read-only GET) to check the connection",
    )


def test_a_declared_idempotency_header_is_sent_and_makes_a_retry_safe(desk, rest, seen):
    custom = rest.plain(idempotency_header="X-Request-Key", idempotency_window_seconds=600)
    assert (custom.honours_idempotency_key, custom.idempotency_window_seconds, custom.retry_safe) == (True, 600, True)
    custom.create_ticket(REQUEST, "key-1", "evt-1")
    assert seen[-1].headers["X-Request-Key"] == "key-1"

    adapter = rest()  # the fake keeps Idempotency-Key
    desk.set_plan(["drop_after_commit", "error_500"])
    with pytest.raises(AmbiguousOutcome):
        adapter.create_ticket(REQUEST, "key-2", "evt-2")
    with pytest.raises(TransientError):
        adapter.create_ticket(REQUEST, "key-2", "evt-2")
    again = adapter.create_ticket(REQUEST, "key-2", "evt-2")
    assert [t["external_id"] for t in desk.tickets()] == ["evt-1", "evt-2"]
    assert again.ticket_id == "2"
    assert [e["idempotency_lookup"] for e in desk.requests_log()][-1] == "hit"


def test_a_declared_upsert_puts_on_the_reference_and_a_comment_stays_ambiguous(desk, rest, seen):
    adapter = rest.plain(
        create_url="/records/by-ref/{external_ref}",
        create_method="PUT",
        upsert=True,
        comment_url_template="/records/{ticket_id}/comments",
        comment_body_template='{"body": "{{ body }}"}',
    )
    assert (adapter.upsert, adapter.retry_safe, adapter.honours_idempotency_key) == (True, False, False)
    first = adapter.create_ticket(REQUEST, "key-1", "mr/1 2")
    second = adapter.create_ticket(
        TicketRequest(subject="Corrected", description="d", requester="j@example.com"), "key-1", "mr/1 2"
    )

    assert first == second
    assert seen[0].path == "/records/by-ref/mr%2F1%202"
    assert (only_record(desk)["subject"], only_record(desk)["external_id"]) == ("Corrected", "mr/1 2")
    desk.set_plan(["error_500"])
    with pytest.raises(AmbiguousOutcome):  # `upsert` is about the create; a comment twice is two comments
        adapter.add_comment(
            first.ticket_id, CommentRequest(body="hello", author_email="j@example.com"), "key-c", "evt-c"
        )


# --- Lookups -------------------------------------------------------------------------------------


def test_the_declared_lookup_finds_the_first_record_or_none(desk, rest, seen):
    adapter = rest()
    assert adapter.consistent_lookup is True
    assert adapter.find_by_external_ref("evt 1&x") is None
    first = adapter.create_ticket(REQUEST, "key-1", "evt 1&x")
    adapter.create_ticket(REQUEST, "key-2", "evt 1&x")
    assert adapter.find_by_external_ref("evt 1&x") == first
    assert seen[-1].query == {"ref": ["evt 1&x"]}


def test_a_404_from_the_lookup_is_none_and_a_path_to_a_non_id_is_configuration(desk, rest):
    by_path = rest(lookup_url_template="/records/by-ref/{external_ref}", lookup_id_path="data.id")
    assert by_path.find_by_external_ref("evt-1") is None  # the fake has no such GET: 404
    wrong = rest(lookup_id_path="data")
    wrong.create_ticket(REQUEST, "key-1", "evt-1")
    with pytest.raises(PermanentError) as caught:
        wrong.find_by_external_ref("evt-1")
    assert caught.value.reason == "configuration"


@pytest.mark.parametrize(
    "value", ["<img src=x onerror=alert(1)>", "1\r\nX-Injected: yes", "a" * 201, "id with spaces", '1"2', "caf\u00e9"]
)
def test_a_lookup_value_that_is_no_usable_ticket_id_is_refused_and_never_stored(desk, rest, value):
    """Finding 4's read channel: whatever an API puts at lookup_id_path became the stored ticket id."""
    desk.on_request(lambda request: (200, {"data": [{"id": value}]}) if request.method == "GET" else None)
    with pytest.raises(PermanentError) as caught:
        rest().find_by_external_ref("evt-1")
    assert caught.value.reason == "configuration"
    assert "not a usable ticket id" in caught.value.detail and value not in caught.value.detail


def test_a_create_answer_whose_id_is_no_usable_ticket_id_is_ambiguous(desk, rest):
    desk.on_request(lambda request: (201, {"data": {"id": "x" * 500}}) if request.method == "POST" else None)
    with pytest.raises(AmbiguousOutcome) as caught:
        rest().create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "unreadable_response" and "x" * 201 not in caught.value.detail


def test_a_lookup_value_within_the_rule_is_kept_as_it_is(desk, rest):
    desk.on_request(lambda request: (200, {"data": [{"id": "INC-0042/a_b.c"}]}) if request.method == "GET" else None)
    assert rest().find_by_external_ref("evt-1").ticket_id == "INC-0042/a_b.c"


@pytest.mark.fakedesk(dialect="rest", search_lag_seconds=0.5)
def test_a_lagging_lookup_is_declared_with_its_settle_delay_and_the_fake_lags(desk, rest):
    adapter = rest(lookup_url_template="/search?ref={external_ref}", lookup_settle_seconds=0.5)
    assert (adapter.consistent_lookup, adapter.lookup_settle_seconds) == (False, 0.5)
    created = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert adapter.find_by_external_ref("evt-1") is None  # the index has not caught up yet
    desk.advance_clock(0.6)  # the index catches up
    assert adapter.find_by_external_ref("evt-1") == created


def test_an_answer_without_the_id_is_ambiguous(desk, rest):
    with pytest.raises(AmbiguousOutcome) as caught:
        rest(id_path="data.ticket.number").create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "unreadable_response"
    assert len(desk.tickets()) == 1


# --- Comments --------------------------------------------------------------------------------


def test_a_comment_renders_its_template_and_returns_the_comment_id(desk, rest, seen):
    adapter = rest()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    reply = CommentRequest(body='Still "broken"\n', author_email="jane@example.com", author_name="Jane")
    assert adapter.add_comment(ticket.ticket_id, reply, "key-c", "evt-2") == "2"
    assert (seen[-1].path, seen[-1].json(), seen[-1].headers["Idempotency-Key"]) == (
        "/records/1/comments",
        {
            "body": 'Still "broken"\n',
            "public": True,
            "author": {"email": "jane@example.com", "name": "Jane"},
            "attachments": [],
        },
        "key-c",
    )
    assert [c["body"] for c in only_record(desk)["comments"]] == ["I was charged twice.", 'Still "broken"\n']

    with pytest.raises(PermanentError) as undeclared:
        rest.plain().add_comment(ticket.ticket_id, CommentRequest(body="x", author_email="y"), "key-d", "evt-3")
    assert undeclared.value.reason == "configuration"


# --- check_connection and credentials --------------------------------------------------------------


def test_check_connection_gets_the_declared_url(rest, seen):
    assert rest().check_connection() == "GET /health answered HTTP 200"
    assert [(r.method, r.path) for r in seen] == [("GET", "/health")]


def test_check_connection_with_a_wrong_token_is_credentials_and_nothing_is_written(desk, rest, monkeypatch):
    adapter = rest()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], "wrong-token")
    with pytest.raises(PermanentError) as caught:
        adapter.check_connection()
    assert caught.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []


def test_check_connection_through_the_lookup_expects_not_found(desk, rest):
    adapter = rest(check_url=None)
    assert adapter.check_connection() == "the lookup answered 'not found' for a made-up reference"
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    unfiltered = rest(check_url=None, lookup_url_template="/records")  # ignores the reference
    with pytest.raises(PermanentError) as caught:
        unfiltered.check_connection()
    assert caught.value.reason == "configuration"


def test_a_secret_header_without_credentials_is_refused_before_sending(tenant, desk, seen):
    destination = make_destination(tenant, slug="no-secret", kind="rest", base_url=desk.url, settings=PLAIN)
    with pytest.raises(PermanentError) as caught:
        adapter_for(destination).create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "credentials"
    assert seen == []


# --- Settings ------------------------------------------------------------------------------------


def test_the_kit_s_settings_are_valid():
    assert validate(RestDestination.SETTINGS, {**kit.SETTINGS, "read_timeout": 2}) == {}


def test_settings_errors_are_reported_field_by_field():
    errors = validate(
        RestDestination.SETTINGS,
        {
            "create_url": "/records/{ticket_id}",
            "create_method": "DELETE",
            "body_template": '{"subject": "{{ subject }}", {% if queue %}',
            "comment_body_template": '{"body": {{ body }}}',
            "id_path": "data..id",
            "headers": {"Authorization": "Bearer {token}", "Bad Header": "x"},
            "lookup_url_template": "ftp://example.com/{external_ref}",
            "queues": {"billing": True},
        },
    )
    assert set(errors) == {
        "create_url",
        "create_method",
        "body_template",
        "comment_body_template",
        "id_path",
        "headers",
        "lookup_url_template",
        "queues",
    }
    assert errors["create_url"] == [
        "unknown placeholder {ticket_id} (known: {external_ref}, {idempotency_key}, "
        "{queue}, {priority}, {request_type}, {assignee})"
    ]
    assert errors["body_template"][0].startswith("template syntax error: Unclosed tag")
    assert "did not render valid JSON" in errors["comment_body_template"][0]
    assert len(errors["headers"]) == 2


@pytest.mark.parametrize(
    "template", ["{% load static %}{}", '{% include "x.json" %}', "{% debug %}", '{"at": "{% now "Y" %}"}']
)
def test_templates_cannot_reach_beyond_the_request(template):
    [message] = validate(RestDestination.SETTINGS, {**PLAIN, "body_template": template})["body_template"]
    assert message.startswith("template syntax error")


def test_a_template_cannot_vary_between_retries():
    [message] = validate(RestDestination.SETTINGS, {**PLAIN, "body_template": '{"n": "{{ subject|random }}"}'})[
        "body_template"
    ]
    assert message == "the filter random is not allowed: a retry must send the very same body"


# --- Templates under a time and size limit (issue 20, finding 9) -----------------------------------------

HUGE = [
    ('{"a": "{{ subject|ljust:30000000 }}"}', "the filter ljust is not allowed: its argument sets the size"),
    ('{"a": "{{ subject|rjust:30000000 }}"}', "the filter rjust is not allowed"),
    ('{"a": "{{ subject|center:30000000 }}"}', "the filter center is not allowed"),
    ('{"a": "{{ subject|stringformat:"030000000d" }}"}', "the filter stringformat is not allowed"),
    ('{"a": "{{ 1|floatformat:-30000000 }}"}', "the filter floatformat is not allowed"),
    ('{"a": "{% filter ljust:30000000 %}x{% endfilter %}"}', "the filter ljust is not allowed"),
    (
        '{"a": "{% for c in description %}{% for d in description %}x{% endfor %}{% endfor %}"}',
        "nested {% for %} loops are not allowed",
    ),
    (
        '{"a": "{% for c in description %}{% if c %}{% for d in subject %}x{% endfor %}{% endif %}{% endfor %}"}',
        "nested {% for %} loops are not allowed",
    ),
    # Quadratic without nesting: each character of the description prints the whole description.
    ('{"a": "{% for c in description %}{{ description }}{% endfor %}"}', "the template rendered more than"),
    ('{"a": "{{ external_ref|make_list|join:subject }}"}', "the template rendered more than"),
]


@pytest.mark.parametrize(("template", "refusal"), HUGE)
def test_a_template_that_could_build_huge_text_is_refused_when_saved_and_quickly(template, refusal):
    started = time.monotonic()
    [message] = validate(RestDestination.SETTINGS, {**PLAIN, "body_template": template})["body_template"]
    assert message.startswith(refusal), message
    assert time.monotonic() - started < 3


def test_the_same_refusals_hold_through_the_admin_and_the_api(tenant, desk, admin_client):
    from tests.support.api import API, api
    from tests.support.users import make_user

    template, refusal = HUGE[0]
    settings = {**PLAIN, "body_template": template}
    page = admin_client.post(
        "/admin/ticketing/destination/add/",
        {"tenant": tenant.pk, "slug": "huge", "kind": "rest", "base_url": desk.url, "settings": json.dumps(settings)},
    )
    assert page.status_code == 200 and refusal in page.content.decode()
    tenant_admin = make_user("rest-admin", groups=["mailroom-admin"], tenants=[tenant])
    answer = api(tenant_admin).post(
        f"{API}/destinations/",
        {"tenant": tenant.slug, "slug": "huge", "kind": "rest", "base_url": desk.url, "settings": settings},
        format="json",
    )
    assert answer.status_code == 400 and refusal in json.dumps(answer.json())
    assert not Destination.objects.filter(slug="huge").exists()


def test_a_stored_template_over_the_time_limit_fails_permanently_and_sends_nothing(tenant, desk, seen, settings):
    """A template stored before these checks (or by a migration): the render budget still stops it."""
    settings.MAILROOM_REST_TEMPLATE_SECONDS = 0.5
    loops = '{"a": "{% for c in description %}{% for d in description %}{% endfor %}{% endfor %}"}'
    destination = make_destination(
        tenant, slug="slow", kind="rest", base_url=desk.url, settings={**PLAIN, "headers": {}, "body_template": loops}
    )
    request = TicketRequest(subject="s", description="x" * 100_000, requester="j@example.com")
    started = time.monotonic()
    with pytest.raises(PermanentError) as caught:
        adapter_for(destination).create_ticket(request, "key-1", "evt-1")
    assert time.monotonic() - started < 2
    assert caught.value.reason == "configuration"
    assert caught.value.detail == "body_template: the template took longer than 0.5 s to render"
    assert seen == [] and desk.tickets() == []


def test_a_stored_template_over_the_size_limit_fails_permanently_and_sends_nothing(tenant, desk, seen):
    quadratic = '{"a": "{% for c in description %}{{ description }}{% endfor %}"}'
    destination = make_destination(
        tenant,
        slug="big",
        kind="rest",
        base_url=desk.url,
        settings={**PLAIN, "headers": {}, "body_template": quadratic},
    )
    request = TicketRequest(subject="s", description="x" * 50_000, requester="j@example.com")
    with pytest.raises(PermanentError) as caught:
        adapter_for(destination).create_ticket(request, "key-1", "evt-1")
    assert caught.value.reason == "configuration"
    assert caught.value.detail.startswith("body_template: the template rendered more than")
    assert seen == [] and desk.tickets() == []


def test_a_long_description_through_a_plain_template_is_sent_whole(desk, rest, seen):
    """The size limit grows with the request: a 3 MB description printed once is fine."""
    description = "Line of a long message.\n" * 130_000
    rest().create_ticket(
        TicketRequest(subject="Long", description=description, requester="j@example.com"), "key-1", "evt-1"
    )
    assert seen[0].json()["description"] == description


def test_required_settings_are_named():
    assert set(validate(RestDestination.SETTINGS, {})) == {"create_url", "body_template", "id_path"}


def test_nothing_logged_carries_bodies_addresses_or_the_token(desk, rest, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = rest()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(
        ticket.ticket_id,
        CommentRequest(body="Secret reply text", author_email="jane.doe@example.com"),
        "key-c",
        "evt-2",
    )
    adapter.find_by_external_ref("evt-1")
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError):
        adapter.create_ticket(REQUEST, "key-2", "evt-3")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    for secret in ("jane.doe@example.com", "charged twice", "Secret reply text", desk.token):
        assert secret not in text


# --- The fake itself ---------------------------------------------------------------------------------


def test_the_fake_refuses_a_missing_or_wrong_bearer_token(desk):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {desk.token}"}):
        answer = requests.post(f"{desk.url}/records", json={"description": "x"}, headers=headers, timeout=5)
        assert (answer.status_code, answer.json()["error"]["code"]) == (401, "unauthorized")
    assert desk.tickets() == []
    ok = requests.get(f"{desk.url}/health", headers={"Authorization": f"Bearer {desk.token}"}, timeout=5)
    assert ok.json() == {"status": "ok"}


# --- Files, people, authorship, closed records and references (issue 22) ---------------------------------

AWKWARD = bytes(range(256)) * 4 + b'\r\n"}]\\u0000{{ subject }}'


def outgoing(index: int, filename: str, data: bytes, content_type: str = "application/octet-stream") -> OutgoingFile:
    return OutgoingFile(
        index=index,
        filename=filename,
        content_type=content_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        payload=lambda: data,
    )


SCREENSHOT = outgoing(0, "screenshot.png", b"\x89PNG" + AWKWARD, "image/png")
INVOICE = outgoing(1, 'invoice "4471".pdf', b"%PDF" + AWKWARD[::-1], "application/pdf")
WITH_FILES = TicketRequest(
    subject="Invoice 4471",
    description="See the files.",
    requester="jane.doe@example.com",
    requester_name="Jane Doe",
    cc=("bob@example.com", "carol@example.com"),
    files=(SCREENSHOT, INVOICE),
)
PER_FILE = {
    "files": "per_file",
    "attachment_url_template": "/records/{ticket_id}/attachments",
    "attachment_body_template": '{"filename": "{{ filename }}", "content_type": "{{ content_type }}", '
    '"sha256": "{{ sha256 }}", "content_base64": "{{ content_base64 }}", '
    '"key": "{{ file_key }}"}',
    "attachment_id_path": "data.id",
}
FILE_LOOKUP = {
    "attachment_lookup_url_template": "/records/{ticket_id}/attachments?key={file_key}",
    "attachment_lookup_id_path": "data.0.id",
}


BODY_WITHOUT_FILES = (
    '{"subject": "{{ subject }}", "description": "{{ description }}", "external_ref": "{{ external_ref }}"}'
)


def sha256s(record: dict) -> Counter:
    return Counter(a["sha256"] for a in record["attachments"])


def test_the_kit_declares_inline_files_and_its_capabilities_follow_the_templates(rest):
    capabilities = rest().capabilities
    assert (
        capabilities.files,
        capabilities.html,
        capabilities.cc_field,
        capabilities.customer_authored_comments,
        capabilities.internal_notes,
        capabilities.closed_policies,
        capabilities.acknowledges_requester,
    ) == ("with_write", True, "cc", True, True, ("follow_up", "review"), False)
    plain = rest.plain().capabilities  # the kit's body (html, cc), but no files, comments or closed_status
    assert (plain.files, plain.html, plain.cc_field, plain.customer_authored_comments, plain.closed_policies) == (
        "none",
        True,
        "cc",
        False,
        ("review",),
    )
    # On the class (no destination): what a REST destination declaring nothing does.
    nothing = RestDestination.capabilities
    assert (
        nothing.files,
        nothing.html,
        nothing.cc_field,
        nothing.customer_authored_comments,
        nothing.internal_notes,
        nothing.acknowledges_requester,
        nothing.requests_per_minute,
    ) == ("none", False, "", False, False, False, None)
    assert rest(requests_per_minute=120).capabilities.requests_per_minute == 120
    assert (rest(requests_per_minute=120).quota.per_minute, rest().quota) == (120, None)  # no quota unless declared
    assert rest(max_file_bytes=1000).capabilities.max_file_bytes == 1000


def test_a_declaration_that_could_lose_or_double_files_sends_none(rest):
    # "inline" with a body that writes no files; "per_file" with no way to settle a lost answer.
    assert rest(body_template=BODY_WITHOUT_FILES).capabilities.files == "none"
    assert rest.plain(**PER_FILE).capabilities.files == "none"
    assert rest.plain(**PER_FILE, **FILE_LOOKUP).capabilities.files == "after_write"
    assert rest(**PER_FILE).capabilities.files == "after_write"  # the kit's Idempotency-Key settles it


def test_inline_files_go_in_the_create_once_each_with_the_requester_and_ccs(desk, rest, seen):
    rest().create_ticket(WITH_FILES, "key-1", "evt-1")

    sent = seen[0].json()["attachments"]
    assert [(f["filename"], f["content_type"], f["size"], f["sha256"]) for f in sent] == [
        (f.filename, f.content_type, f.size, f.sha256) for f in WITH_FILES.files
    ]
    assert [base64.b64decode(f["content_base64"]) for f in sent] == [f.read() for f in WITH_FILES.files]
    record = only_record(desk)
    assert sha256s(record) == Counter({SCREENSHOT.sha256: 1, INVOICE.sha256: 1})
    assert [a["filename"] for a in record["attachments"]] == ["screenshot.png", 'invoice "4471".pdf']
    assert "content_base64" not in json.dumps(record["fields"])  # the record keeps the files, not a copy
    assert record["people"] == {"requester": "jane.doe@example.com", "cc": ["bob@example.com", "carol@example.com"]}
    assert [(p["email"], p["name"]) for p in desk.people()] == [("jane.doe@example.com", "Jane Doe")]


def test_a_lost_answer_after_a_create_with_files_is_retried_under_its_key_and_each_file_is_there_once(desk, rest):
    adapter = rest()
    desk.set_plan(["drop_after_commit"])
    with pytest.raises(AmbiguousOutcome):
        adapter.create_ticket(WITH_FILES, "key-1", "evt-1")
    again = adapter.create_ticket(WITH_FILES, "key-1", "evt-1")  # the same body, the same key: a replay

    record = only_record(desk)
    assert again.ticket_id == str(record["id"])
    assert sha256s(record) == Counter({SCREENSHOT.sha256: 1, INVOICE.sha256: 1})
    assert [e["idempotency_lookup"] for e in desk.requests_log()] == ["miss", "hit"]


def test_the_fake_refuses_a_file_whose_declared_sha256_is_not_its_content(desk):
    bad = {
        "subject": "s",
        "description": "d",
        "external_ref": "evt-1",
        "attachments": [{"filename": "a.bin", "content_base64": "AAAA", "sha256": "0" * 64}],
    }
    answer = requests.post(
        f"{desk.url}/records", json=bad, headers={"Authorization": f"Bearer {desk.token}"}, timeout=5
    )
    assert answer.status_code == 422 and answer.json()["error"]["details"] == {
        "attachments.0": ["sha256 does not match the content"]
    }
    assert desk.tickets() == []


@pytest.mark.parametrize("declared", [{}, FILE_LOOKUP], ids=["by-key", "by-lookup"])
def test_per_file_calls_attach_each_file_once_even_when_an_answer_is_lost(desk, rest, declared):
    # by-key: the kit's Idempotency-Key (each file has its own); by-lookup: no key, the declared lookup.
    adapter = rest(**PER_FILE, **declared) if not declared else rest.plain(**PER_FILE, **declared)
    assert adapter.capabilities.files == "after_write"
    ticket_id = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    desk.set_plan(["ok", "drop_after_commit"])  # the second file's answer is lost

    with pytest.raises(TransientError):
        attach_each(adapter, ticket_id, WITH_FILES.files, "key-1")
    done = attach_each(adapter, ticket_id, WITH_FILES.files, "key-1")

    record = only_record(desk)
    assert sha256s(record) == Counter({SCREENSHOT.sha256: 1, INVOICE.sha256: 1})
    assert [a["marker"] for a in record["attachments"]] == ["key-1-f0", "key-1-f1"]
    assert done == {"done": [str(a["id"]) for a in record["attachments"]], "refused": []}


def test_a_comment_carries_its_author_public_flag_and_files(desk, rest):
    adapter = rest()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    adapter.add_comment(
        ticket_id,
        CommentRequest(
            body="Still broken.", author_email="jane.doe@example.com", author_name="Jane Doe", files=(SCREENSHOT,)
        ),
        "key-2",
        "evt-2",
    )
    adapter.add_comment(
        ticket_id,
        CommentRequest(body="Refund issued.", author_email="alice@support.example", public=False, from_agent=True),
        "key-3",
        "evt-3",
    )

    record = only_record(desk)
    assert kit.comment_records_of(record) == [
        {"body": "Still broken.", "public": True, "author": "jane.doe@example.com"},
        {"body": "Refund issued.", "public": False, "author": "alice@support.example"},
    ]
    [attached] = record["attachments"]
    assert (attached["sha256"], attached["comment_id"]) == (SCREENSHOT.sha256, record["comments"][1]["id"])


def test_a_comment_template_without_the_author_opens_with_who_wrote_it(desk, rest, seen):
    adapter = rest(comment_body_template='{"body": "{{ body }}"}')
    assert adapter.capabilities.customer_authored_comments is False
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(
        "1", CommentRequest(body="Hi", author_email="zoe@example.net", author_name="Zoe Q"), "key-c", "evt-c"
    )
    assert seen[-1].json() == {"body": "From: Zoe Q <zoe@example.net>\n\nHi"}


def test_a_private_comment_is_false_in_the_template_too(desk, rest, seen):
    adapter = rest(comment_body_template='{"body": "{{ body }}"{% if not public %}, "internal": true{% endif %}}')
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(
        "1",
        CommentRequest(body="Note", author_email="a@support.example", public=False, from_agent=True),
        "key-c",
        "evt-c",
    )
    assert seen[-1].json() == {"body": "From: a@support.example\n\nNote", "internal": True}


def test_a_comment_on_a_closed_record_is_refused_as_closed_where_the_status_is_declared(desk, rest):
    adapter = rest()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    desk.close(int(ticket_id))
    with pytest.raises(TicketClosed) as caught:
        adapter.add_comment(ticket_id, CommentRequest(body="Hi", author_email="jane@example.com"), "key-2", "evt-2")
    assert caught.value.reason == "ticket_closed"
    with pytest.raises(TransientError) as undeclared:  # without closed_status, a 409 is the common table's
        rest(closed_status=None).add_comment(
            ticket_id, CommentRequest(body="Hi", author_email="j@example.com"), "key-3", "evt-3"
        )
    assert undeclared.value.reason == "conflict"
    assert only_record(desk)["comments"][1:] == []


def test_a_follow_up_names_the_closed_record(desk, rest, seen):
    follow_up = TicketRequest(
        subject="Again", description="Still broken", requester="jane@example.com", follow_up_of="1"
    )
    rest().create_ticket(follow_up, "key-1", "evt-1")
    assert kit.follow_up_of(only_record(desk)) == "1" and seen[-1].json()["description"] == "Still broken"
    rest(body_template=BODY_WITHOUT_FILES).create_ticket(follow_up, "key-2", "evt-2")
    assert seen[-1].json()["description"] == "Follow-up of record 1, which is closed.\n\nStill broken"


def test_a_declared_reference_template_finds_the_record_in_a_reply_s_subject(rest):
    adapter = rest(reference_template="[REC-{ticket_id}]")
    [pattern] = adapter.reference_patterns
    found = pattern.search("Re: [REC-42] Printer on fire")
    assert found and adapter.resolve_reference(found.group("ref")) == "42"
    assert pattern.search("Re: [REC-] x") is None and pattern.search("REC-42") is None
    assert rest().reference_patterns == () and kit.desk_reference(None) == ""
    errors = validate(RestDestination.SETTINGS, {**PLAIN, "reference_template": "{ticket_id}"})
    assert errors == {"reference_template": ["must be at most 100 characters, with at least 2 around {ticket_id}"]}
    errors = validate(RestDestination.SETTINGS, {**PLAIN, "reference_template": "[{ticket_id}-{queue}]"})
    assert errors == {"reference_template": ["must hold {ticket_id} once and no other placeholder"]}


def test_the_new_settings_are_checked_field_by_field():
    assert validate(RestDestination.SETTINGS, {**PLAIN, **PER_FILE, **FILE_LOOKUP, "closed_status": 409}) == {}
    errors = validate(
        RestDestination.SETTINGS,
        {
            **PLAIN,
            "files": "attached",
            "attachment_url_template": "/records/{external_ref}/files",
            "attachment_body_template": '{"name": {{ filename }}}',
            "closed_status": 500,
            "attachment_lookup_id_path": "data..id",
        },
    )
    assert set(errors) == {
        "files",
        "attachment_url_template",
        "attachment_body_template",
        "closed_status",
        "attachment_lookup_id_path",
    }
    assert errors["attachment_url_template"] == ["unknown placeholder {external_ref} (known: {ticket_id}, {file_key})"]


def test_the_egress_guard_checks_the_attachment_urls_too(settings):
    from ticketing.destinations import egress_errors

    assert {"attachment_url_template", "attachment_lookup_url_template"} <= set(RestDestination.fetched_url_settings)
    errors = egress_errors(
        "rest",
        "",
        {
            **PLAIN,
            "create_url": "https://api.example.com/records",
            "attachment_url_template": "http://169.254.169.254/{ticket_id}",
        },
    )
    assert errors.get("settings")
