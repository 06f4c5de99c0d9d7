"""Header reading of real-world mail: broken header blocks, addresses as clients write them, charsets.

Messages are written the way the named clients write them (Outlook/Exchange, Gmail,
Apple Mail, Foxmail, Japanese and Korean clients, bounces, broken gateways), and each
test asserts the exact sender, subject and text that a person reading the mail sees.
No database is needed.
"""

import base64
import time

from intake.mime import decode_bytes, decode_header_value, parse_message, thread_ids
from intake.mime.addresses import is_valid_address, parse_address_list
from intake.mime.charsets import codec_for, decode, decode_encoded_words
from intake.mime.headerblock import MAX_HEADER_BLOCK, repair_header_block
from tests.support.mime import PDF, typical_message

CRLF = b"\r\n"


def mail(*headers, body: bytes = b"body\r\n") -> bytes:
    """Header lines (str, or bytes for raw 8-bit ones), the blank line, then `body`."""
    lines = [h if isinstance(h, bytes) else h.encode("ascii") for h in headers]
    return CRLF.join(lines) + CRLF + CRLF + body


def b_word(charset: str, data: bytes) -> str:
    return f"=?{charset}?B?{base64.b64encode(data).decode('ascii')}?="


def b64_body(data: bytes) -> bytes:
    return base64.encodebytes(data).replace(b"\n", CRLF)


def assert_headers_not_in_body(parsed, *fragments):
    for fragment in ("From:", "Subject:", "To:", *fragments):
        assert fragment not in parsed.text, fragment


# -- what real clients send --------------------------------------------------------------------


def test_outlook_exchange_message_with_a_character_split_across_encoded_words():
    subject = "Überweisung für Rechnung 4711 – dringend"
    data = subject.encode("utf-8")
    cut = data.index("ü".encode()) + 1  # between the two bytes of "ü"
    raw = mail(
        "Received: from AM6PR04MB5432.eurprd04.prod.outlook.com (2603:10a6:20b:f8::20) by"
        " AM6PR04MB5432.eurprd04.prod.outlook.com with HTTPS; Tue, 2 Apr 2024 09:15:03 +0000",
        'From: "Doe, Jane" <jane.doe@contoso.com>',
        "To: support@acme.test; Bob Smith bob.smith@contoso.com;carol@fabrikam.com",
        "CC: 'Dave Jones' <dave@contoso.com>",
        f"Subject: {b_word('utf-8', data[:cut])}",
        f" {b_word('utf-8', data[cut:])}",
        "Thread-Topic: =?utf-8?B?w5xiZXJ3ZWlzdW5n?=",
        "Thread-Index: AQHahN0wG3n1k2x4y5z6A7B8C9D0Eg==",
        "Date: Tue, 2 Apr 2024 09:15:02 +0000",
        "Message-ID: <AM6PR04MB5432A1B2C3D4E5F6@AM6PR04MB5432.eurprd04.prod.outlook.com>",
        "Accept-Language: de-DE, en-US",
        "Content-Language: de-DE",
        "X-MS-Has-Attach:",
        "X-MS-TNEF-Correlator:",
        "x-ms-exchange-organization-authas: Internal",
        "X-MS-Exchange-CrossTenant-originalarrivaltime: 02 Apr 2024 09:15:02.1234 (UTC)",
        "X-MS-Exchange-CrossTenant-fromentityheader: Hosted",
        'Content-Type: text/plain; charset="utf-8"',
        "Content-Transfer-Encoding: base64",
        "MIME-Version: 1.0",
        body=b64_body("Guten Tag,\r\n\r\nbitte prüfen Sie die Überweisung.\r\n".encode()),
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name, parsed.sender_source) == ("jane.doe@contoso.com", "Doe, Jane", "from")
    assert parsed.subject == subject
    assert parsed.recipients == ["support@acme.test", "bob.smith@contoso.com", "carol@fabrikam.com", "dave@contoso.com"]
    assert parsed.text == "Guten Tag,\n\nbitte prüfen Sie die Überweisung."


def test_gmail_message_with_one_invalid_byte_in_its_utf8_body():
    raw = mail(
        "Delivered-To: support@acme.test",
        "Received: by 2002:a05:7300:5d0e:b0:12c:4a5:1e2f with SMTP id r14csp1234567dyb;",
        "        Tue, 2 Apr 2024 02:15:02 -0700 (PDT)",
        "X-Google-Smtp-Source: AGHT+IFexampleexampleexample",
        "ARC-Seal: i=1; a=rsa-sha256; t=1712049302; cv=none; d=google.com; s=arc-20160816; b=AbCd",
        "DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=gmail.com; s=20230601;",
        "        h=to:subject:message-id:date:from:mime-version; bh=47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=;",
        "        b=AbCdEf",
        "X-Gm-Message-State: AOJu0YwExampleExampleExample",
        "X-Gm-Gg: ASbGnctExample",
        "MIME-Version: 1.0",
        "From: =?UTF-8?Q?Mar=C3=ADa_Jos=C3=A9_Garc=C3=ADa?= <maria.jose.garcia@gmail.com>",
        "Date: Tue, 2 Apr 2024 11:14:51 +0200",
        "Message-ID: <CAF=XyZ+abc123@mail.gmail.com>",
        "Subject: =?UTF-8?B?TGEgaW1wcmVzb3JhIGVzdMOhIHJvdGE=?=",
        "To: support@acme.test",
        'Content-Type: text/plain; charset="UTF-8"',
        "Content-Transfer-Encoding: quoted-printable",
        # One byte of the body is damaged (=FF): the rest is still UTF-8.
        body=b"Hola, la impresora est=C3=A1 rota otra vez. A=C3=B1ad=C3=AD una foto=FF.\r\nGracias\r\n",
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("maria.jose.garcia@gmail.com", "María José García")
    assert parsed.subject == "La impresora está rota"
    assert parsed.text == "Hola, la impresora está rota otra vez. Añadí una foto\ufffd.\nGracias"


def test_apple_mail_quoted_printable_words_split_inside_a_character():
    raw = mail(
        "From: =?utf-8?Q?Fran=C3=A7ois_L=C3=A9ger?= <francois.leger@me.com>",
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: quoted-printable",
        "Mime-Version: 1.0 (Mac OS X Mail 16.0 \\(3774.500.171.1.1\\))",
        "Subject: =?utf-8?Q?Probl=C3=A8me_d=E2=80?= =?utf-8?Q?=99impression?=",
        "Message-Id: <5E1B2C3D-4F5A-6B7C-8D9E-0F1A2B3C4D5E@me.com>",
        "Date: Tue, 2 Apr 2024 11:20:00 +0200",
        "To: support@acme.test",
        "X-Mailer: Apple Mail (2.3774.500.171.1.1)",
        body=b"L=E2=80=99imprimante ne marche plus.\r\n",
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("francois.leger@me.com", "François Léger")
    assert parsed.subject == "Problème d’impression"
    assert parsed.text == "L’imprimante ne marche plus."


def test_foxmail_gbk_text_labelled_gb2312_keeps_characters_outside_gb2312():
    # 镕 is in GBK, 𠮷 only in GB18030; Foxmail labels both "gb2312".
    name, subject, body = "朱镕", "关于镕的发票问题", "您好，发票在附件里。𠮷野家的收据也在。\r\n"
    raw = mail(
        f"From: {b_word('gb2312', name.encode('gb18030'))} <zhurong@foxmail.com>",
        'To: "support" <support@acme.test>',
        f"Subject: {b_word('gb2312', subject.encode('gb18030'))}",
        "Date: Tue, 2 Apr 2024 17:20:00 +0800",
        "X-Mailer: Foxmail 7.2.25.228[cn]",
        "Mime-Version: 1.0",
        "Message-ID: <202404021720001234567@foxmail.com>",
        'Content-Type: text/plain; charset="gb2312"',
        "Content-Transfer-Encoding: base64",
        body=b64_body(body.encode("gb18030")),
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("zhurong@foxmail.com", "朱镕")
    assert parsed.subject == "关于镕的发票问题"
    assert parsed.text == "您好，发票在附件里。𠮷野家的收据也在。"


def test_raw_gbk_headers_and_filename_are_read_in_the_charset_the_body_declares():
    head = (
        "From: 王小明 <wang@163.com>\r\nTo: support@acme.test\r\nSubject: 回复：打印机坏了\r\n"
        "X-Mailer: Foxmail 7.2.25.228[cn]\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/mixed; boundary="----=_NextPart_001"\r\n\r\n'
    ).encode("gbk")
    parts = (
        b'------=_NextPart_001\r\nContent-Type: text/plain; charset="gb2312"\r\n'
        b"Content-Transfer-Encoding: 8bit\r\n\r\n"
        + "请看附件。\r\n".encode("gbk")
        + b"------=_NextPart_001\r\nContent-Type: application/pdf\r\n"
        b'Content-Disposition: attachment; filename="' + "报告.pdf".encode("gbk") + b'"\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\n" + b64_body(PDF) + b"------=_NextPart_001--\r\n"
    )
    parsed = parse_message(head + parts)
    assert (parsed.sender, parsed.sender_name) == ("wang@163.com", "王小明")
    assert parsed.subject == "回复：打印机坏了"
    assert parsed.text == "请看附件。"
    assert [a.filename for a in parsed.attachments] == ["报告.pdf"]


def test_rfc2047_and_raw_utf8_filenames():
    raw = mail(
        "From: a@example.com",
        'Content-Type: multipart/mixed; boundary="b"',
        body=(
            b"--b\r\nContent-Type: text/plain\r\n\r\nfiles\r\n"
            b"--b\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment;\r\n"
            b' filename="' + b_word("gb2312", "镕的报告.pdf".encode("gb18030")).encode() + b'"\r\n\r\n%PDF-1.4\r\n'
            b"--b\r\nContent-Type: application/pdf\r\n"
            b'Content-Disposition: attachment; filename="' + "Prüfbericht.pdf".encode() + b'"\r\n\r\n%PDF-1.4\r\n'
            b"--b--\r\n"
        ),
    )
    assert [a.filename for a in parse_message(raw).attachments] == ["镕的报告.pdf", "Prüfbericht.pdf"]


def test_japanese_iso_2022_jp_with_windows_extensions_and_half_width_katakana():
    subject = b"\x1b$B-!\x1b(B" + "見積書の件".encode("iso2022_jp")  # ① as Outlook writes it (CP50220)
    raw = mail(
        f"From: {b_word('ISO-2022-JP', '山田太郎'.encode('iso2022_jp'))} <yamada@example.co.jp>",
        "To: support@acme.test",
        f"Subject: {b_word('ISO-2022-JP', subject)}",
        "Message-ID: <20240402101500.1234@example.co.jp>",
        "X-Mailer: Becky! ver. 2.81.04",
        "MIME-Version: 1.0",
        "Content-Type: text/plain; charset=ISO-2022-JP",
        "Content-Transfer-Encoding: 7bit",
        body="お世話になっております。ｶﾀｶﾅの件です。\r\n".encode("iso2022_jp_ext"),
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("yamada@example.co.jp", "山田太郎")
    assert parsed.subject == "①見積書の件"
    assert parsed.text == "お世話になっております。ｶﾀｶﾅの件です。"


def test_shift_jis_mislabelled_as_iso_2022_jp():
    text = "お問い合わせありがとうございます。見積書をお送りします。"
    raw = mail(
        "From: sato@example.jp",
        f"Subject: {b_word('iso-2022-jp', '見積書の送付'.encode('cp932'))}",
        "Content-Type: text/plain; charset=iso-2022-jp",
        "Content-Transfer-Encoding: 8bit",
        body=text.encode("cp932") + CRLF,
    )
    parsed = parse_message(raw)
    assert parsed.subject == "見積書の送付"
    assert parsed.text == text


def test_korean_outlook_label_ks_c_5601_1987_reads_cp949():
    # 똠 is in cp949 (UHC) but not in EUC-KR proper: Python's euc_kr would lose it.
    raw = mail(
        f"From: {b_word('ks_c_5601-1987', '김똠순'.encode('cp949'))} <kim@example.co.kr>",
        f"Subject: {b_word('ks_c_5601-1987', '똠방각하 문의'.encode('cp949'))}",
        'Content-Type: text/plain; charset="ks_c_5601-1987"',
        "Content-Transfer-Encoding: base64",
        body=b64_body("안녕하세요. 똠방각하 건으로 문의드립니다.\r\n".encode("cp949")),
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("kim@example.co.kr", "김똠순")
    assert parsed.subject == "똠방각하 문의"
    assert parsed.text == "안녕하세요. 똠방각하 건으로 문의드립니다."
    euc_kr = mail("From: a@example.kr", "Content-Type: text/plain; charset=EUC-KR", body="똠 문의\r\n".encode("cp949"))
    assert parse_message(euc_kr).text == "똠 문의"


def test_cyrillic_raw_koi8_r_headers_and_undeclared_windows_1251_body():
    raw = (
        b"From: " + "Иван Петров".encode("koi8_r") + b" <ivan@example.ru>\r\n"
        b"Subject: " + "Заявка на ремонт".encode("koi8_r") + b"\r\n"
        b"Content-Type: text/plain; charset=koi8-r\r\n\r\n" + "Принтер сломался.\r\n".encode("koi8_r")
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("ivan@example.ru", "Иван Петров")
    assert parsed.subject == "Заявка на ремонт"
    assert parsed.text == "Принтер сломался."
    text = "Здравствуйте! Принтер снова не работает, просьба прислать мастера как можно скорее."
    undeclared = mail(
        "From: olga@example.ru",
        f"Subject: {b_word('windows-1251', 'Принтер'.encode('cp1251'))}",
        body=text.encode("cp1251") + CRLF,
    )
    parsed = parse_message(undeclared)
    assert parsed.subject == "Принтер"
    assert parsed.text == text


def test_raw_utf8_subject_and_unquoted_display_name():
    raw = "From: Jörg Müller jm@example.de\r\nSubject: Grüße aus München\r\n\r\nHallo\r\n".encode()
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("jm@example.de", "Jörg Müller")
    assert parsed.subject == "Grüße aus München"


def test_raw_cp1252_subject_and_unquoted_display_name():
    raw = b"From: Ren\xe9e Dupont renee@example.fr\r\nSubject: R\xe9union \x96 caf\xe9 \x80 5\r\n\r\nBonjour\r\n"
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.sender_name) == ("renee@example.fr", "Renée Dupont")
    assert parsed.subject == "Réunion – café € 5"


def test_encoded_words_with_spaces_and_split_multibyte_characters():
    assert decode_header_value("=?us-ascii?Q?ABC / 123?=") == "ABC / 123"
    assert decode_header_value("Order =?utf-8?Q?n=C2=BA 42?= shipped") == "Order nº 42 shipped"
    data = "你好世界".encode()
    split = f"{b_word('utf-8', data[:4])} {b_word('UTF-8', data[4:])}"  # 好 is bytes 3-5
    assert decode_header_value(split) == "你好世界"
    # Different charsets are decoded separately; whitespace between encoded words is dropped.
    mixed = f"{b_word('iso-8859-1', 'café'.encode('latin-1'))} {b_word('utf-8', ' – ok'.encode())}"
    assert decode_encoded_words(mixed) == "café – ok"
    assert decode_encoded_words("x =?utf-8?B?a?= y") == "x =?utf-8?B?a?= y"  # undecodable: as written


def test_one_invalid_byte_never_turns_utf8_into_mojibake():
    data = "Grüße aus München – schöne Grüße".encode() + b"\xff" + " Jürgen".encode()
    assert decode_bytes(data, "utf-8") == "Grüße aus München – schöne Grüße\ufffd Jürgen"
    assert decode_bytes(data, None) == "Grüße aus München – schöne Grüße\ufffd Jürgen"
    # A label that fails on most bytes is wrong: cp1252 text labelled UTF-8 is read as cp1252.
    assert decode_bytes("Réunion à propos du problème".encode("cp1252"), "utf-8") == "Réunion à propos du problème"


def test_charset_labels_read_as_mail_clients_read_them():
    assert [
        codec_for(label)
        for label in (
            "GB2312",
            "x-gbk",
            "EUC-CN",
            "GBK",
            "Shift_JIS",
            "x-sjis",
            "EUC-KR",
            "ks_c_5601-1987",
            "Big5",
            "TIS-620",
            "ISO-8859-8-i",
            "latin1",
            "windows-1252",
            '"utf8"',
            "x-no-such-charset",
            "punycode",
        )
    ] == [
        "gb18030",
        "gb18030",
        "gb18030",
        "gb18030",
        "cp932",
        "cp932",
        "cp949",
        "cp949",
        "big5hkscs",
        "cp874",
        "iso8859-8",
        "windows-1252",
        "windows-1252",
        "utf-8",
        None,
        None,
    ]
    # WHATWG windows-1252: 0x80-0x9F are cp1252's characters, its five holes the C1 controls.
    assert decode(b"\x80\x81\x93x\x94\x9d", "iso-8859-1") == "€\x81“x”\x9d"
    assert decode("เครื่องพิมพ์".encode("cp874"), "tis-620") == "เครื่องพิมพ์"
    assert decode("שלום".encode("iso8859_8"), "iso-8859-8-i") == "שלום"
    assert decode("鏞".encode("big5hkscs"), "big5") == "鏞"


# -- broken header blocks -------------------------------------------------------------------------


def test_junk_and_an_mbox_from_line_before_the_first_header_are_dropped():
    raw = mail(
        "Archived by MailStore Server 13",
        "From jane@example.com Mon Apr  1 10:00:00 2024",
        "From: Jane <jane@example.com>",
        "To: support@acme.test",
        "Subject: Printer on fire",
        "Message-ID: <junk-1@example.com>",
        "References: <root@example.com>",
        body=b"Please help.\r\n",
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.subject, parsed.text) == ("jane@example.com", "Printer on fire", "Please help.")
    assert_headers_not_in_body(parsed, "MailStore", "Message-ID")
    assert "HeaderBlockRepaired" in parsed.defects
    # Ingest keys the message from the same repaired header block.
    assert thread_ids(raw) == ("junk-1@example.com", "", ["root@example.com"])
    assert thread_ids(raw) == (parsed.message_id, parsed.in_reply_to, parsed.references)


def test_address_lists_that_continue_on_unindented_lines():
    raw = mail(
        "From: jane@example.com",
        "To: support@acme.test,",
        "alice@example.com, Bob <bob@example.com>",
        "Cc: carol@example.com;",
        "dave@example.com",
        "Subject: Quarterly numbers",
        body=b"Attached.\r\n",
    )
    parsed = parse_message(raw)
    assert parsed.sender == "jane@example.com" and parsed.subject == "Quarterly numbers"
    assert parsed.recipients == [
        "support@acme.test",
        "alice@example.com",
        "bob@example.com",
        "carol@example.com",
        "dave@example.com",
    ]
    assert parsed.text == "Attached."
    assert_headers_not_in_body(parsed, "@example.com")
    # The last header too, when its line ends with "," (a list cannot end there).
    last = mail("From: jane@example.com", "Subject: s", "To: support@acme.test,", "alice@example.com", body=b"Hi\r\n")
    parsed = parse_message(last)
    assert parsed.recipients == ["support@acme.test", "alice@example.com"] and parsed.text == "Hi"
    # A long distribution list, one address a line: more lines than a stray run may have.
    team = [f"member{i}@example.com" for i in range(40)]
    long_list = mail(
        "From: jane@example.com",
        "To: support@acme.test,",
        *[f"{a}," for a in team[:-1]],
        team[-1],
        "Subject: All hands",
        body=b"Agenda\r\n",
    )
    parsed = parse_message(long_list)
    assert parsed.recipients == ["support@acme.test", *team]
    assert (parsed.subject, parsed.text) == ("All hands", "Agenda")


def test_subject_that_wraps_without_indentation():
    raw = mail(
        "From: jane@example.com",
        "Subject: The printer on the third floor is",
        "on fire again",
        "Date: Tue, 2 Apr 2024 09:15:02 +0000",
        "Message-ID: <wrap@example.com>",
        body=b"Help\r\n",
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.subject) == ("jane@example.com", "The printer on the third floor is on fire again")
    assert (parsed.message_id, parsed.text) == ("wrap@example.com", "Help")
    assert_headers_not_in_body(parsed, "fire again", "Date:")


def test_encoded_word_on_its_own_line():
    data = "Überweisung für März".encode()
    raw = mail(
        "From: jane@example.com",
        "To: support@acme.test",
        f"Subject: {b_word('utf-8', data[:10])}",
        b_word("utf-8", data[10:]),
        body=b"Danke\r\n",
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.subject, parsed.text) == ("jane@example.com", "Überweisung für März", "Danke")
    assert_headers_not_in_body(parsed, "=?utf-8?")


def test_stray_line_in_the_middle_is_skipped_and_later_headers_count():
    raw = mail(
        "From: Jane <jane@example.com>",
        "Date: Tue, 2 Apr 2024 09:15:02 +0000",
        "X-Scanned-By: MIMEDefang 2.84",
        "--- scanned by gateway, no virus found ---",
        "Subject: Invoice 4711",
        "To: support@acme.test",
        "Message-ID: <stray@example.com>",
        body=b"See attached.\r\n",
    )
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.subject, parsed.text) == ("jane@example.com", "Invoice 4711", "See attached.")
    assert (parsed.recipients, parsed.message_id) == (["support@acme.test"], "stray@example.com")
    assert_headers_not_in_body(parsed, "scanned", "Message-ID")


def test_whitespace_before_the_colon_is_accepted():
    raw = mail("From  : Jane <jane@example.com>", "Subject : Printer", "To\t: support@acme.test", body=b"It broke.\r\n")
    parsed = parse_message(raw)
    assert (parsed.sender, parsed.subject, parsed.recipients) == ("jane@example.com", "Printer", ["support@acme.test"])
    assert parsed.text == "It broke."
    assert_headers_not_in_body(parsed)


def test_a_missing_blank_line_still_starts_the_body_at_the_first_loose_line():
    raw = b"From: jane@example.com\r\nSubject: Hi\r\nHello there,\r\nthe printer is broken.\r\n"
    assert repair_header_block(raw) is raw
    parsed = parse_message(raw)
    assert (parsed.subject, parsed.text) == ("Hi", "Hello there,\nthe printer is broken.")


def test_clean_header_block_is_returned_as_is_and_hostile_ones_are_bounded():
    raw = typical_message()
    assert repair_header_block(raw) is raw
    mbox = b"From jane@example.com Mon Apr  1 10:00:00 2024\r\n" + raw
    assert repair_header_block(mbox) is mbox  # the parser itself handles a leading "From " line
    hostile = [
        b"From: a@example.com\r\n" + b"junk\r\nX-A: 1\r\n" * 60_000 + b"\r\nbody",
        b"From: a@example.com\r\n" + b"x\r\n" * 300_000 + b"Subject: s\r\n\r\nbody",
        b"junk line\r\n" * 300_000,
        b"From: a@example.com\r\nSubject: " + b"=?utf-8?q?" * 100_000 + b"\r\n\r\nbody",
    ]
    for message in hostile:
        started = time.perf_counter()
        parse_message(message)
        thread_ids(message)
        assert time.perf_counter() - started < 3
    repaired = repair_header_block(hostile[0])
    assert len(repaired) < len(hostile[0]) and repaired.endswith(hostile[0][MAX_HEADER_BLOCK:])
    assert parse_message(hostile[1]).sender == "a@example.com"


# -- addresses --------------------------------------------------------------------------------------


def test_a_display_name_without_quotes_is_never_part_of_the_address():
    parsed = parse_message(mail("From: Test test@example.com"))
    assert (parsed.sender, parsed.sender_name) == ("test@example.com", "Test")


def test_address_lists_separated_by_spaces_or_semicolons():
    parsed = parse_message(
        mail(
            "From: a@example.com",
            "To: support@acme.test other@example.org",
            "Cc: Bob Smith bob@example.com;'Carol' <carol@example.com>; dave@example.com",
        )
    )
    assert parsed.recipients == [
        "support@acme.test",
        "other@example.org",
        "bob@example.com",
        "carol@example.com",
        "dave@example.com",
    ]
    assert parse_address_list("'Bob Smith' <bob@contoso.com>; undisclosed-recipients:;") == [
        ("Bob Smith", "bob@contoso.com")
    ]


def test_sender_is_the_first_valid_address_over_every_from_header():
    parsed = parse_message(mail("From: undisclosed sender", "From: Jane <jane@example.com>"))
    assert (parsed.sender, parsed.sender_name, parsed.sender_source) == ("jane@example.com", "Jane", "from")
    parsed = parse_message(mail("From: broken@@example..com, Jane <jane@example.com>"))
    assert (parsed.sender, parsed.sender_source) == ("jane@example.com", "from")


def test_sender_falls_back_to_sender_then_reply_to():
    parsed = parse_message(mail("Sender: Helpdesk <helpdesk@example.com>", "Reply-To: other@example.com"))
    assert (parsed.sender, parsed.sender_name, parsed.sender_source) == ("helpdesk@example.com", "Helpdesk", "sender")
    parsed = parse_message(mail("From: nobody", "Reply-To: Jane <jane@example.com>"))
    assert (parsed.sender, parsed.sender_name, parsed.sender_source) == ("jane@example.com", "Jane", "reply-to")
    assert parsed.sender_hint == "nobody"


def test_bounce_whose_from_holds_no_address_gives_a_hint():
    parsed = parse_message(mail("From: MAILER-DAEMON", "Subject: Undelivered Mail Returned to Sender"))
    assert (parsed.sender, parsed.sender_source, parsed.sender_hint) == ("", "", "mailer-daemon")
    parsed = parse_message(mail("From: Mail Delivery System <MAILER-DAEMON>"))
    assert (parsed.sender, parsed.sender_hint) == ("", "mailer-daemon")
    assert parse_message(mail("From: jane@example.com")).sender_hint == ""


def test_is_valid_address():
    valid = [
        "jane@example.com",
        "o'brien+tag@mail.example.ie",
        "jörg@exämple.de",
        "a@[192.0.2.1]",
        "x@[IPv6:2001:db8::1]",
    ]
    invalid = [
        "",
        "jane",
        "jane@localhost",
        "@example.com",
        "jane@",
        "a b@example.com",
        "a@@example.com",
        "a@example..com",
        "a@.example.com",
        "a@example.com.",
        "a\x00@example.com",
        "<a@example.com>",
        "a" * 65 + "@example.com",
        "a@" + "b" * 250 + ".com",
    ]
    assert [a for a in valid if not is_valid_address(a)] == []
    assert [a for a in invalid if is_valid_address(a)] == []
