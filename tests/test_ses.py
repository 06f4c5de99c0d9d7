"""Amazon SES inbound through SNS (`/webhooks/ses/<slug>/`, intake.providers.ses and .sns).

Real servers on 127.0.0.1: an HTTPS stand-in for SNS serving the signing certificate and the
SubscribeURL (tests/sns.py), and moto's S3-compatible server for the S3 action. Notifications are
signed with the stand-in's key, SignatureVersion 1 and 2.

How the production host rule stays covered while the stand-in lives on 127.0.0.1: the `sns_server`
fixture sets MAILROOM_SNS_CERT_HOST_PATTERN to 127.0.0.1 for the tests that need a certificate fetched;
`test_default_host_pattern_*` check the shipped default (read from the settings before any test
changes them) on real and look-alike hosts, and `test_wrong_certificate_host_*` puts that default
back and shows a message whose certificate lives on the stand-in is refused without one request to it.
"""

import base64
import datetime
import json

import boto3
import pytest
import requests
from django.conf import settings as django_settings
from django.test import Client
from moto.server import ThreadedMotoServer

from intake.keys import message_id_from_raw
from intake.models import AuditEvent, InboxEvent, Mailbox
from intake.providers import sns
from intake.providers.base import WebhookRejected
from tests.factories import email_message
from tests.services import free_port
from tests.sns import (
    CERT_PATH,
    CONFIRM_PATH,
    SNS_TOPIC_ARN,
    SnsKeys,
    ses_notification,
    signed_sns_message,
    sns_server,  # noqa: F401  (fixture)
    sns_timestamp,
)

URL = "/webhooks/ses/ses-box/"
SHIPPED_HOST_PATTERN = django_settings.MAILROOM_SNS_CERT_HOST_PATTERN  # before any test overrides it
S3_SECRET_VAR = "MAILROOM_T_ACME_SES_S3_SECRET"  # tenant-scoped (tenant "acme"): no platform listing needed
BUCKET = "acme-inbound-mail"


@pytest.fixture
def ses_mailbox(tenant):
    return Mailbox.objects.create(
        tenant=tenant,
        slug="ses-box",
        address="support@acme.test",
        provider="ses",
        webhook_secret_ref="",
        settings={"topic_arn": SNS_TOPIC_ARN},
    )


def post(message: dict):
    return Client().post(
        URL,
        data=json.dumps(message).encode(),
        content_type="text/plain; charset=UTF-8",
        HTTP_X_AMZ_SNS_MESSAGE_TYPE=message.get("Type", ""),
    )


def events():
    return list(InboxEvent.objects.order_by("pk"))


# --- the host rule -----------------------------------------------------------------------------------

REAL_CERT = "/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem"


@pytest.mark.parametrize(
    "url",
    [
        f"https://sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://sns.eu-west-1.amazonaws.com{REAL_CERT}",
        f"https://sns.cn-north-1.amazonaws.com.cn{REAL_CERT}",
        f"https://sns.us-east-1.amazonaws.com:443{REAL_CERT}",
    ],
)
def test_default_host_pattern_accepts_sns_hosts(url, settings):
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = SHIPPED_HOST_PATTERN
    assert sns.check_certificate_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        f"http://sns.us-east-1.amazonaws.com{REAL_CERT}",  # not https
        f"https://sns.us-east-1.amazonaws.com.evil.test{REAL_CERT}",  # a look-alike suffix
        f"https://evil.test/sns.us-east-1.amazonaws.com{REAL_CERT}",  # the name in the path only
        f"https://sns.amazonaws.com{REAL_CERT}",  # no region
        f"https://s3.us-east-1.amazonaws.com/bucket{REAL_CERT}",  # another AWS service anyone can fill
        f"https://sns.us-east-1.amazonaws.com@evil.test{REAL_CERT}",  # user-info trick: the host is evil.test
        f"https://127.0.0.1{REAL_CERT}",
        # Finding 3: urlsplit reads these hosts as SNS's, requests (urllib3) connects to attacker.example.
        f"https://attacker.example\\@sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://attacker.example%5C@sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://attacker.example%5c@sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://attacker.example#@sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://attacker.example:x@sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://attacker.example/@sns.us-east-1.amazonaws.com{REAL_CERT}",
        f"https://sns.us-east-1.amazonaws.com {REAL_CERT}",  # whitespace
        f"https://sns.us-east-1.amazonaws.com\t{REAL_CERT}",  # a control character
        f"https://sns.us-east-1.amazonaws.com:8443{REAL_CERT}",  # not port 443
        f"https://sns.us-east-1.amazonaws.com{REAL_CERT}#x",  # a fragment
        "https://sns.us-east-1.amazonaws.com/cert.pem",  # not SNS's certificate path
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-XYZ.pem",
        f"https://sns.us-east-1.amazonaws.com{REAL_CERT}?x=1",
        "https://sns.us-east-1.amazonaws.com/uploads/SimpleNotificationService-abc.pem",
    ],
)
def test_default_host_pattern_refuses_other_hosts(url, settings):
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = SHIPPED_HOST_PATTERN
    with pytest.raises(WebhookRejected):
        sns.check_certificate_url(url)


SNS_HOST = "sns.eu-west-1.amazonaws.com"
CONFIRM_QUERY = f"?Action=ConfirmSubscription&TopicArn={SNS_TOPIC_ARN}&Token=tok"


def subscription(url: str) -> dict:
    return {"Type": "SubscriptionConfirmation", "TopicArn": SNS_TOPIC_ARN, "Token": "tok", "SubscribeURL": url}


def test_the_documented_subscribe_url_passes(settings):
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = SHIPPED_HOST_PATTERN
    url = f"https://{SNS_HOST}/{CONFIRM_QUERY}"
    assert sns.check_subscribe_url(subscription(url)) == url


@pytest.mark.parametrize(
    "url",
    [
        f"https://attacker.example\\@{SNS_HOST}/{CONFIRM_QUERY}",
        f"https://attacker.example%5C@{SNS_HOST}/{CONFIRM_QUERY}",
        f"https://attacker.example#@{SNS_HOST}/{CONFIRM_QUERY}",
        f"https://user:password@{SNS_HOST}/{CONFIRM_QUERY}",
        f"https://{SNS_HOST}:8443/{CONFIRM_QUERY}",
        f"http://{SNS_HOST}/{CONFIRM_QUERY}",
        f"https://{SNS_HOST}/other{CONFIRM_QUERY}",  # not the path SNS uses
        f"https://{SNS_HOST}/?Action=Unsubscribe&TopicArn={SNS_TOPIC_ARN}&Token=tok",  # another action
        f"https://{SNS_HOST}/{CONFIRM_QUERY}&Action=ConfirmSubscription",  # a field twice
        f"https://{SNS_HOST}/{CONFIRM_QUERY}&Extra=1",
        f"https://{SNS_HOST}/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:eu-west-1:999:other&Token=tok",
        f"https://{SNS_HOST}/?Action=ConfirmSubscription&TopicArn={SNS_TOPIC_ARN}&Token=another",
    ],
)
def test_a_subscribe_url_off_sns_or_off_its_shape_is_refused(url, settings):
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = SHIPPED_HOST_PATTERN
    with pytest.raises(WebhookRejected):
        sns.check_subscribe_url(subscription(url))


def test_wrong_certificate_host_is_refused_without_fetching(ses_mailbox, sns_server, settings, count_rows):
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = SHIPPED_HOST_PATTERN  # production's rule, not the test's
    before = count_rows()
    message = signed_sns_message(sns_server.cert_url, ses_notification(email_message()))
    response = post(message)
    assert response.status_code == 401
    assert sns_server.requests[CERT_PATH] == 0
    assert count_rows() == before


@pytest.mark.parametrize("trick", ["\\@", "%5C@", "%5c@", "#@", "/@", "@"])
def test_a_certificate_url_that_hides_its_host_is_refused_without_fetching(
    ses_mailbox, sns_server, settings, count_rows, trick
):
    """Finding 3: `https://attacker.example\\@sns.us-east-1.amazonaws.com/...` passed the urlsplit host check,
    and requests fetched the attacker's certificate. The stand-in plays attacker.example here: it serves the
    key this forged notification is signed with."""
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = SHIPPED_HOST_PATTERN
    cert_url = f"https://127.0.0.1:{sns_server.port}{trick}sns.us-east-1.amazonaws.com{CERT_PATH}"
    before = count_rows()
    response = post(signed_sns_message(cert_url, ses_notification(email_message(subject="Pay this invoice"))))
    assert response.status_code == 401
    assert sum(sns_server.requests.values()) == 0
    assert count_rows() == before


@pytest.mark.parametrize("trick", ["\\@", "%5C@", "#@", "@"])
def test_a_subscribe_url_that_hides_its_host_is_not_visited(ses_mailbox, sns_server, trick):
    """Finding 3, SubscribeURL: the same trick made an unauthenticated request to any host (here a server
    counting its connections) from a validly signed confirmation."""
    from tests.support.servers import CountingServer

    victim = CountingServer()
    try:
        subscribe_url = (
            f"https://127.0.0.1:{victim.port}{trick}127.0.0.1/?Action=ConfirmSubscription"
            f"&TopicArn={SNS_TOPIC_ARN}&Token=tok"
        )
        message = signed_sns_message(sns_server.cert_url, kind="SubscriptionConfirmation", subscribe_url=subscribe_url)
        assert post(message).status_code == 401
        assert victim.connections == 0 and sns_server.requests[CONFIRM_PATH] == 0
    finally:
        victim.stop()


def test_certificate_over_plain_http_is_refused_without_fetching(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    message = signed_sns_message(sns_server.cert_url.replace("https://", "http://"), ses_notification(email_message()))
    assert post(message).status_code == 401
    assert sns_server.requests[CERT_PATH] == 0
    assert count_rows() == before


# --- notifications with the message inside (the SNS action) ---------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_valid_notification_is_stored_once_and_the_certificate_fetched_once(ses_mailbox, sns_server, version):
    raw = email_message(subject="Printer on fire", body="Please help, Bj\u00f6rn.\n")
    message = signed_sns_message(sns_server.cert_url, ses_notification(raw, ses_message_id="ses-0001"), version=version)

    first = post(message)
    assert first.status_code == 202, first.content
    [event] = events()
    assert bytes(event.raw) == raw and event.source == "ses" and event.mailbox == ses_mailbox
    assert event.provider_message_id == message_id_from_raw(raw)  # the RFC 5322 Message-ID, not SES's id
    metadata = AuditEvent.objects.get(inbox_event=event, kind="provider_metadata").detail
    assert metadata["ses_message_id"] == "ses-0001" and metadata["action"] == "SNS"

    again = post(message)  # SNS retries a delivery whose answer it did not see
    assert again.status_code == 200
    assert again.json()["inbox_events"] == [{"inbox_event_id": event.pk, "duplicate": True}]
    assert len(events()) == 1
    assert sns_server.requests[CERT_PATH] == 1  # cached per process, by URL


def test_utf8_content_encoding_is_stored(ses_mailbox, sns_server):
    raw = email_message(subject="Plain text")
    response = post(signed_sns_message(sns_server.cert_url, ses_notification(raw, encoding="UTF8")))
    assert response.status_code == 202
    assert bytes(events()[0].raw) == raw


def test_forged_notification_is_refused_and_nothing_stored(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    genuine = signed_sns_message(sns_server.cert_url, ses_notification(email_message(subject="Genuine")))
    tampered = {**genuine, "Message": ses_notification(email_message(subject="Pay this invoice"))}
    assert post(tampered).status_code == 401

    other_key = SnsKeys().signing_key  # signed, but not by the certificate's key
    forged = signed_sns_message(sns_server.cert_url, ses_notification(email_message()), key=other_key)
    assert post(forged).status_code == 401

    assert count_rows() == before


def test_notification_of_another_topic_is_refused(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    # Validly signed by SNS: anybody can publish to a topic of their own.
    message = signed_sns_message(
        sns_server.cert_url,
        ses_notification(email_message()),
        topic_arn="arn:aws:sns:eu-west-1:999999999999:someone-else",
    )
    assert post(message).status_code == 401
    assert count_rows() == before


def test_notification_older_than_an_hour_is_refused(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1, minutes=1)
    message = signed_sns_message(sns_server.cert_url, ses_notification(email_message()), timestamp=sns_timestamp(old))
    assert post(message).status_code == 401
    assert count_rows() == before


def test_unreachable_certificate_is_a_temporary_failure(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    closed = f"https://127.0.0.1:{free_port()}{CERT_PATH}"
    response = post(signed_sns_message(closed, ses_notification(email_message())))
    assert response.status_code == 503  # SNS retries 5xx
    assert count_rows() == before


def test_mailbox_without_a_topic_refuses_everything(ses_mailbox, sns_server, count_rows):
    ses_mailbox.settings = {}
    ses_mailbox.save()
    before = count_rows()
    assert post(signed_sns_message(sns_server.cert_url, ses_notification(email_message()))).status_code == 401
    assert count_rows() == before


def test_setup_notification_is_answered_and_stores_nothing(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    setup = json.dumps({"notificationType": "AMAZON_SES_SETUP_NOTIFICATION", "receipt": {}})
    response = post(signed_sns_message(sns_server.cert_url, setup))
    assert response.status_code == 200
    assert count_rows() == before


# --- subscription ----------------------------------------------------------------------------------


def test_subscription_confirmation_visits_the_subscribe_url_once(ses_mailbox, sns_server, count_rows):
    before = count_rows()
    message = signed_sns_message(
        sns_server.cert_url, kind="SubscriptionConfirmation", subscribe_url=sns_server.subscribe_url, version=1
    )
    response = post(message)
    assert response.status_code == 200
    assert response.json() == {"subscription": "confirmed"}
    assert sns_server.requests[CONFIRM_PATH] == 1
    assert count_rows() == before


def test_subscription_confirmation_to_another_host_is_not_visited(ses_mailbox, sns_server):
    message = signed_sns_message(
        sns_server.cert_url, kind="SubscriptionConfirmation", subscribe_url="https://localhost:1/confirm?Token=t"
    )
    assert post(message).status_code == 401
    assert sns_server.requests[CONFIRM_PATH] == 0


def test_forged_subscription_confirmation_is_not_visited(ses_mailbox, sns_server):
    message = signed_sns_message(
        sns_server.cert_url, kind="SubscriptionConfirmation", subscribe_url=sns_server.subscribe_url
    )
    message["Token"] = "another-token"  # signed fields changed after signing
    assert post(message).status_code == 401
    assert sns_server.requests[CONFIRM_PATH] == 0


# --- the S3 action ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server():
    """moto's S3-compatible server on 127.0.0.1 (a real HTTP server), one per session: it takes a second to stop."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_s3(moto_server):
    """The S3 stand-in, emptied, with the mailbox's bucket and another one."""
    requests.post(f"{moto_server}/moto-api/reset", timeout=10).raise_for_status()
    client = boto3.client(
        "s3",
        endpoint_url=moto_server,
        region_name="eu-west-1",
        aws_access_key_id="AKIAMAILROOMTEST",
        aws_secret_access_key="test-secret-key",
    )
    for bucket in (BUCKET, "someone-elses-bucket"):
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    yield moto_server, client


@pytest.fixture
def s3_mailbox(ses_mailbox, moto_s3, monkeypatch):
    endpoint, _ = moto_s3
    monkeypatch.setenv(S3_SECRET_VAR, "test-secret-key")
    ses_mailbox.settings = {
        "topic_arn": SNS_TOPIC_ARN,
        "s3_bucket": BUCKET,
        "s3_prefix": "inbound/",
        "s3_region": "eu-west-1",
        "s3_endpoint_url": endpoint,
        "s3_access_key_id": "AKIAMAILROOMTEST",
    }
    ses_mailbox.credentials_ref = f"env:{S3_SECRET_VAR}"
    ses_mailbox.save()
    return ses_mailbox


def large_message() -> bytes:
    # Over SES's 150 KB SNS-action limit: only the S3 action can bring it. Bytes that are not UTF-8 included.
    blob = bytes(range(256)) * 1600
    return email_message(subject="Scanned contract", attachments=[("contract.pdf", "application/pdf", blob)])


def test_large_message_through_s3_is_stored_with_its_exact_bytes(s3_mailbox, moto_s3, sns_server):
    _, client = moto_s3
    raw = large_message()
    assert len(raw) > 150 * 1024
    client.put_object(Bucket=BUCKET, Key="inbound/0a1b2c3d", Body=raw)
    message = signed_sns_message(
        sns_server.cert_url, ses_notification(action="S3", bucket=BUCKET, key="inbound/0a1b2c3d")
    )

    assert post(message).status_code == 202
    [event] = events()
    assert bytes(event.raw) == raw and event.size == len(raw)
    metadata = AuditEvent.objects.get(inbox_event=event, kind="provider_metadata").detail
    assert metadata["s3_object"] == f"s3://{BUCKET}/inbound/0a1b2c3d"

    assert post(message).status_code == 200
    assert len(events()) == 1


def test_notification_naming_another_bucket_is_refused(s3_mailbox, moto_s3, sns_server, count_rows):
    _, client = moto_s3
    client.put_object(Bucket="someone-elses-bucket", Key="inbound/secret", Body=email_message())
    before = count_rows()
    message = signed_sns_message(
        sns_server.cert_url, ses_notification(action="S3", bucket="someone-elses-bucket", key="inbound/secret")
    )
    assert post(message).status_code == 400
    assert count_rows() == before


def test_object_outside_the_prefix_is_refused(s3_mailbox, moto_s3, sns_server, count_rows):
    _, client = moto_s3
    client.put_object(Bucket=BUCKET, Key="other/0001", Body=email_message())
    before = count_rows()
    message = signed_sns_message(sns_server.cert_url, ses_notification(action="S3", bucket=BUCKET, key="other/0001"))
    assert post(message).status_code == 400
    assert count_rows() == before


def test_missing_object_is_a_temporary_failure_then_stored_on_retry(s3_mailbox, moto_s3, sns_server, count_rows):
    _, client = moto_s3
    raw = email_message(subject="Late object")
    message = signed_sns_message(sns_server.cert_url, ses_notification(action="S3", bucket=BUCKET, key="inbound/late"))
    before = count_rows()
    assert post(message).status_code == 503  # SNS retries
    assert count_rows() == before

    client.put_object(Bucket=BUCKET, Key="inbound/late", Body=raw)
    assert post(message).status_code == 202
    assert bytes(events()[0].raw) == raw


def test_unresolvable_s3_secret_is_a_temporary_failure(s3_mailbox, moto_s3, sns_server, monkeypatch, count_rows):
    _, client = moto_s3
    client.put_object(Bucket=BUCKET, Key="inbound/x", Body=email_message())
    monkeypatch.delenv(S3_SECRET_VAR)
    before = count_rows()
    message = signed_sns_message(sns_server.cert_url, ses_notification(action="S3", bucket=BUCKET, key="inbound/x"))
    assert post(message).status_code == 503
    assert count_rows() == before


def test_raw_message_delivery_is_refused(ses_mailbox, sns_server, count_rows):
    # With "raw message delivery" on, SNS posts the bare notification: unsigned, so never trusted.
    before = count_rows()
    body = ses_notification(email_message()).encode()
    response = Client().post(URL, data=body, content_type="text/plain")
    assert response.status_code == 401
    body = base64.b64encode(email_message())
    assert Client().post(URL, data=body, content_type="text/plain").status_code == 401
    assert count_rows() == before
