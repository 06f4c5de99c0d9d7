"""Bounces as real mail systems write them, for a message we sent (its header block as the relay received it).

    postfix_dsn(headers, recipient, mailbox=)  multipart/report, message/delivery-status, text/rfc822-headers
    postfix_global_dsn(headers, recipient)     the same for an SMTPUTF8 message (RFC 6533): global-delivery-status
    postfix_delay(headers, recipient)          the same, Action: delayed, Status: 4.4.1 (a warning, not a failure)
    exim_dsn(headers, recipient)               Exim 4.9x: multipart/report with the whole message/rfc822
    exim_plain(headers, recipient)             older Exim: text/plain, "a copy of the message, including all the
                                               headers"
    qmail_plain(headers, recipient)            qmail-send's "failure notice", the copy below the line
    gmail_dsn(headers, recipient, message_id)  "Delivery Status Notification (Failure)", In-Reply-To our message
    exchange_ndr(headers, recipient)           Exchange Online's "Undeliverable:", text/rfc822-headers
    read_receipt(headers, recipient, message_id)  a disposition-notification (an MDN): no bounce

`headers` is the returned message's header block (bytes, CRLF or LF); `recipient` the address that failed.
Dates and queue ids are fixed: the parser must not depend on them.
"""

import re

MAILBOX = "support@acme.test"
DATE = "Wed, 2 Dec 2026 02:10:00 +0000"


def _lf(headers: bytes) -> str:
    return headers.decode("utf-8", "replace").replace("\r\n", "\n").rstrip("\n")


def _subject(headers: bytes) -> str:
    found = re.search(r"^Subject: (.*)$", _lf(headers), re.MULTILINE)
    return found.group(1) if found else ""


def _crlf(text: str) -> bytes:
    return text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8")


def _postfix(
    headers: bytes,
    recipient: str,
    *,
    action: str,
    status: str,
    diagnostic: str,
    notice: str,
    mailbox: str = MAILBOX,
    smtputf8: bool = False,
) -> bytes:
    domain = recipient.rpartition("@")[2]
    # An SMTPUTF8 message's DSN (RFC 6533), as Postfix writes it: global-delivery-status, utf-8 addresses.
    report, status_part, headers_part, kind = (
        ("global-delivery-status", "message/global-delivery-status", "message/global-headers", "utf-8")
        if smtputf8
        else ("delivery-status", "message/delivery-status", "text/rfc822-headers", "rfc822")
    )
    return _crlf(f"""Return-Path: <>
Delivered-To: {mailbox}
Received: by mx1.acme.test (Postfix)
	id 4Zk2Qm1Hx7z9sLp; {DATE} (UTC)
Date: {DATE} (UTC)
From: MAILER-DAEMON@mx1.acme.test (Mail Delivery System)
Subject: {notice}
To: {mailbox}
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type={report};
	boundary="4Zk2Qm1Hx7z9sLp.1796177400/mx1.acme.test"
Content-Transfer-Encoding: 8bit
Message-Id: <20261202021000.4Zk2Qm1Hx7z9sLp@mx1.acme.test>

This is a MIME-encapsulated message.

--4Zk2Qm1Hx7z9sLp.1796177400/mx1.acme.test
Content-Description: Notification
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: 8bit

This is the mail system at host mx1.acme.test.

I'm sorry to have to inform you that your message could not
be delivered to one or more recipients. It's attached below.

For further assistance, please send mail to postmaster.

                   The mail system

<{recipient}>: host mx.{domain}[192.0.2.25] said: {diagnostic} (in reply to RCPT TO command)

--4Zk2Qm1Hx7z9sLp.1796177400/mx1.acme.test
Content-Description: Delivery report
Content-Type: {status_part}

Reporting-MTA: dns; mx1.acme.test
X-Postfix-Queue-ID: 4Zk2Qm1Hx7z9sLp
X-Postfix-Sender: rfc822; {mailbox}
Arrival-Date: {DATE} (UTC)

Final-Recipient: {kind}; {recipient}
Original-Recipient: {kind};{recipient}
Action: {action}
Status: {status}
Remote-MTA: dns; mx.{domain}
Diagnostic-Code: smtp; {diagnostic}

--4Zk2Qm1Hx7z9sLp.1796177400/mx1.acme.test
Content-Description: Undelivered Message Headers
Content-Type: {headers_part}
Content-Transfer-Encoding: 8bit

{_lf(headers)}

--4Zk2Qm1Hx7z9sLp.1796177400/mx1.acme.test--
""")


def postfix_dsn(headers: bytes, recipient: str, mailbox: str = MAILBOX) -> bytes:
    return _postfix(
        headers,
        recipient,
        action="failed",
        status="5.1.1",
        notice="Undelivered Mail Returned to Sender",
        mailbox=mailbox,
        diagnostic=f"550 5.1.1 <{recipient}>: Recipient address rejected: User unknown in virtual mailbox table",
    )


def postfix_global_dsn(headers: bytes, recipient: str) -> bytes:
    return _postfix(
        headers,
        recipient,
        action="failed",
        status="5.1.1",
        notice="Undelivered Mail Returned to Sender",
        diagnostic=f"550 5.1.1 <{recipient}>: Recipient address rejected: User unknown",
        smtputf8=True,
    )


def postfix_delay(headers: bytes, recipient: str) -> bytes:
    return _postfix(
        headers,
        recipient,
        action="delayed",
        status="4.4.1",
        notice="Delayed Mail (still being retried)",
        diagnostic="connect to mx.example.com[192.0.2.25]:25: Connection timed out",
    )


def exim_dsn(headers: bytes, recipient: str) -> bytes:
    domain = recipient.rpartition("@")[2]
    return _crlf(f"""Return-path: <>
Envelope-to: {MAILBOX}
Received: from mailnull by mail.{domain} with local (Exim 4.97.1)
	id 1vQk3Z-00051p-2B
	for {MAILBOX};
	{DATE}
X-Failed-Recipients: {recipient}
Auto-Submitted: auto-replied
From: Mail Delivery System <Mailer-Daemon@mail.{domain}>
To: {MAILBOX}
Content-Type: multipart/report; report-type=delivery-status; boundary=1796177400-eximdsn-1804289383
MIME-Version: 1.0
Subject: Mail delivery failed: returning message to sender
Message-Id: <E1vQk3Z-00051p-2B@mail.{domain}>
Date: {DATE}

--1796177400-eximdsn-1804289383
Content-type: text/plain; charset=us-ascii

This message was created automatically by mail delivery software.

A message that you sent could not be delivered to one or more of its
recipients. This is a permanent error. The following address(es) failed:

  {recipient}
    host mx.{domain} [203.0.113.5]
    SMTP error from remote mail server after RCPT TO:<{recipient}>:
    550 5.1.1 <{recipient}>: Recipient address rejected: User unknown

--1796177400-eximdsn-1804289383
Content-type: message/delivery-status

Reporting-MTA: dns; mail.{domain}

Action: failed
Final-Recipient: rfc822;{recipient}
Status: 5.0.0
Remote-MTA: dns; mx.{domain}
Diagnostic-Code: smtp; 550 5.1.1 <{recipient}>: Recipient address rejected: User unknown

--1796177400-eximdsn-1804289383
Content-type: message/rfc822

{_lf(headers)}

Hello,

we have received your request.

--1796177400-eximdsn-1804289383--
""")


def exim_plain(headers: bytes, recipient: str) -> bytes:
    domain = recipient.rpartition("@")[2]
    return _crlf(f"""Return-path: <>
Envelope-to: {MAILBOX}
Received: from mailnull by mail.{domain} with local (Exim 4.69)
	id 1KqPZm-0003Qx-8T
	for {MAILBOX}; {DATE}
X-Failed-Recipients: {recipient}
From: Mail Delivery System <Mailer-Daemon@mail.{domain}>
To: {MAILBOX}
Subject: Mail delivery failed: returning message to sender
Message-Id: <E1KqPZm-0003Qx-8T@mail.{domain}>
Date: {DATE}

This message was created automatically by mail delivery software.

A message that you sent could not be delivered to one or more of its
recipients. This is a permanent error. The following address(es) failed:

  {recipient}
    SMTP error from remote mail server after RCPT TO:<{recipient}>:
    host mx.{domain} [203.0.113.5]: 550 5.1.1 <{recipient}>... User unknown

------ This is a copy of the message, including all the headers. ------

{_lf(headers)}

Hello,

we have received your request.
""")


def qmail_plain(headers: bytes, recipient: str) -> bytes:
    domain = recipient.rpartition("@")[2]
    return _crlf(f"""Return-Path: <>
Received: (qmail 28151 invoked for bounce); {DATE}
Date: {DATE}
From: MAILER-DAEMON@mail.{domain}
To: {MAILBOX}
Subject: failure notice
Message-ID: <20261202021000.28151.qmail@mail.{domain}>

Hi. This is the qmail-send program at mail.{domain}.
I'm afraid I wasn't able to deliver your message to the following addresses.
This is a permanent error; I've given up. Sorry it didn't work out.

<{recipient}>:
203.0.113.5 does not like recipient.
Remote host said: 550 5.1.1 <{recipient}>: Recipient address rejected: User unknown
Giving up on 203.0.113.5.

--- Below this line is a copy of the message.

{_lf(headers)}

Hello,

we have received your request.
""")


def gmail_dsn(headers: bytes, recipient: str, message_id: str) -> bytes:
    return _crlf(f"""Delivered-To: {MAILBOX}
Return-Path: <>
Received: by 2002:a05:6402:1234:b0:5d0:aaaa:bbbb with SMTP id ab12csp123456edb;
        Wed, 2 Dec 2026 02:10:00 -0800 (PST)
From: Mail Delivery Subsystem <mailer-daemon@googlemail.com>
To: {MAILBOX}
Auto-Submitted: auto-replied
Subject: Delivery Status Notification (Failure)
References: {message_id}
In-Reply-To: {message_id}
X-Failed-Recipients: {recipient}
Message-ID: <692e4b58.050a0220.3a1b2c.9d8eGMR@mx.google.com>
Date: Wed, 02 Dec 2026 02:10:00 -0800 (PST)
MIME-Version: 1.0
Content-Type: multipart/report; boundary="000000000000b3c1d20644f1a2b3"; report-type=delivery-status

--000000000000b3c1d20644f1a2b3
Content-Type: multipart/alternative; boundary="000000000000b3c4e50644f1a2b4"

--000000000000b3c4e50644f1a2b4
Content-Type: text/plain; charset="UTF-8"


** Address not found **

Your message wasn't delivered to {recipient} because the address couldn't be found, or is unable to
receive mail.

Learn more here: https://support.google.com/mail/?p=NoSuchUser

The response was:

550 5.1.1 The email account that you tried to reach does not exist. Please try
double-checking the recipient's email address for typos or unnecessary spaces.
https://support.google.com/mail/?p=NoSuchUser a640c23a62f3a-ab7c1d2e3f4si123456766b.12 - gsmtp

--000000000000b3c4e50644f1a2b4
Content-Type: text/html; charset="UTF-8"

<html><head></head><body><h2>Address not found</h2><p>Your message wasn't delivered to <a>{recipient}</a>
because the address couldn't be found, or is unable to receive mail.</p></body></html>

--000000000000b3c4e50644f1a2b4--

--000000000000b3c1d20644f1a2b3
Content-Type: message/delivery-status

Reporting-MTA: dns; googlemail.com
Received-From-MTA: dns; {MAILBOX}
Arrival-Date: Wed, 02 Dec 2026 02:09:58 -0800 (PST)
X-Original-Message-ID: {message_id}

Final-Recipient: rfc822; {recipient}
Action: failed
Status: 5.1.1
Diagnostic-Code: smtp; 550-5.1.1 The email account that you tried to reach does not exist. Please try
 550-5.1.1 double-checking the recipient's email address for typos or
 550 5.1.1 https://support.google.com/mail/?p=NoSuchUser - gsmtp
Last-Attempt-Date: Wed, 02 Dec 2026 02:10:00 -0800 (PST)

--000000000000b3c1d20644f1a2b3
Content-Type: text/rfc822-headers

{_lf(headers)}

--000000000000b3c1d20644f1a2b3--
""")


def exchange_ndr(headers: bytes, recipient: str) -> bytes:
    domain = recipient.rpartition("@")[2]
    return _crlf(f"""Received: from AM0PR02MB5555.eurprd02.prod.outlook.com (2603:10a6:208:ac::14)
 by AM0PR02MB4444.eurprd02.prod.outlook.com with HTTPS; {DATE}
From: Microsoft Outlook <MicrosoftExchange329e71ec88ae4615bbc36ab6ce41109e@{domain}>
To: <{MAILBOX}>
Date: {DATE}
Content-Type: multipart/report; report-type=delivery-status;
	boundary="2a1f0c3e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
X-MS-Exchange-Message-Is-Ndr:
Content-Language: en-US
Message-ID: <0c8b2d11-4f2a-4d6e-9a3b-7e1c5f9d2b40@AM0PR02MB5555.eurprd02.prod.outlook.com>
Subject: Undeliverable: {_subject(headers)}
Auto-Submitted: auto-replied
MIME-Version: 1.0

--2a1f0c3e-5b6d-4e7f-8a9b-0c1d2e3f4a5b
Content-Type: text/plain; charset="us-ascii"
Content-Transfer-Encoding: quoted-printable

Your message to {recipient} couldn't be delivered.
{recipient.partition("@")[0]} wasn't found at {domain}.

Remote Server returned '550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient no=
t found by SMTP address lookup'

--2a1f0c3e-5b6d-4e7f-8a9b-0c1d2e3f4a5b
Content-Type: message/delivery-status

Reporting-MTA: dns;AM0PR02MB5555.eurprd02.prod.outlook.com
Received-From-MTA: dns;mx1.acme.test
Arrival-Date: {DATE}

Original-Recipient: rfc822;{recipient}
Final-Recipient: rfc822;{recipient}
Action: failed
Status: 5.1.10
Diagnostic-Code: smtp;550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient {recipient} not found by SMTP address lookup

--2a1f0c3e-5b6d-4e7f-8a9b-0c1d2e3f4a5b
Content-Type: text/rfc822-headers

{_lf(headers)}

--2a1f0c3e-5b6d-4e7f-8a9b-0c1d2e3f4a5b--
""")


def read_receipt(headers: bytes, recipient: str, message_id: str) -> bytes:
    return _crlf(f"""From: <{recipient}>
To: {MAILBOX}
Subject: Read: {_subject(headers)}
Date: {DATE}
Message-ID: <mdn-0042@{recipient.rpartition("@")[2]}>
In-Reply-To: {message_id}
MIME-Version: 1.0
Content-Type: multipart/report; report-type=disposition-notification;
	boundary="mdn-boundary-0042"

--mdn-boundary-0042
Content-Type: text/plain; charset=utf-8

Your message was displayed on the recipient's computer.

--mdn-boundary-0042
Content-Type: message/disposition-notification

Reporting-UA: mail.example.com; Thunderbird
Final-Recipient: rfc822;{recipient}
Original-Message-ID: {message_id}
Disposition: manual-action/MDN-sent-manually; displayed

--mdn-boundary-0042
Content-Type: text/rfc822-headers

{_lf(headers)}

--mdn-boundary-0042--
""")
