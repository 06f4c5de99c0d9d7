"""Real-mail parsing, second round: message/news, message/partial and message/external-body parts,
a BOM before the headers, other text body types, names and addresses as real clients write them,
CJK raw headers under a misleading charset hint, S/MIME certificates-only and stray signatures."""

from pathlib import Path

from intake.mime import attachment_payload, charsets, cms, parse_message
from intake.mime.addresses import is_valid_address, parse_address_list
from intake.mime.richtext import enriched_to_text, richtext_to_text

CORPUS = Path(__file__).parent / "corpus"


def corpus(name: str):
    return parse_message((CORPUS / name).read_bytes())


def mail(*headers: str, body: str = "hello\n") -> bytes:
    return ("\r\n".join(headers) + "\r\n\r\n" + body).encode("utf-8")


def test_a_forwarded_news_article_that_is_the_only_content_is_the_body_and_an_attached_message():
    parsed = corpus("news_forward_thunderbird.eml")
    assert "ERROR 0x8007052E after 14 minutes" in parsed.text
    assert [(a.filename, a.declared_type) for a in parsed.attachments] == [
        ("Nightly backup job fails with quota exceeded.eml", "message/news")
    ]


def test_a_news_article_next_to_a_text_part_is_listed_but_not_read_as_the_body():
    parsed = corpus("news_forward_tin.eml")
    assert parsed.text.startswith("Forwarding my question") and "prn-3f-east" not in parsed.text
    assert [a.filename for a in parsed.attachments] == ["printer queue stuck.eml"]


def test_an_external_body_pointer_becomes_one_line_of_text_and_no_attachment():
    parsed = corpus("external_body_pine.eml")
    assert (
        "External file: ftp://ftp.example.edu/pub/incoming/lab7/vmcore-20240305.gz (application/gzip; "
        "access-type anon-ftp; size 398458880 bytes; expires Wed, 20 Mar 2024 00:00:00 -0500)"
    ) in parsed.text
    assert parsed.attachments == []
    url = corpus("external_body_url_netscape.eml")
    assert "External file: https://files.example.com/share/it/client-update-7.4.2-install.log (" in url.text


def test_message_partial_pieces_all_present_are_reassembled_into_one_attached_message():
    parsed = corpus("partial_two_pieces_digest.eml")
    assert "port 500\nrule 113: deny udp" in parsed.text
    assert [(a.filename, a.declared_type) for a in parsed.attachments] == [
        ("Firewall rule export.eml", "message/rfc822")
    ]
    assert b"Please restore rules 112 and 113" in attachment_payload(parsed, 0)


def test_a_message_partial_piece_without_its_siblings_is_a_file():
    parsed = corpus("partial_piece_missing.eml")
    assert [(a.filename, a.declared_type) for a in parsed.attachments] == [("partial 1 of 3.eml", "message/partial")]
    assert "rule 112" not in parsed.text


def test_a_byte_order_mark_before_the_first_header_keeps_the_sender():
    parsed = parse_message(b"\xef\xbb\xbfFrom: Backup <backup@example.com>\r\nSubject: done\r\n\r\nok\r\n")
    assert (parsed.sender, parsed.subject, parsed.text) == ("backup@example.com", "done", "ok")
    parsed = parse_message(b"\xef\xbb\xbf\r\n\r\nFrom: backup@example.com\r\nSubject: done\r\n\r\nok\r\n")
    assert (parsed.sender, parsed.subject) == ("backup@example.com", "done")


def test_enriched_text_is_converted_as_rfc_1896_says():
    source = (
        "one\r\nline\r\n\r\nnext <<para>\r\n<color><param>red</param>Red</color> <nofill>kept\r\n  as is\r\n</nofill>"
    )
    assert enriched_to_text(source) == "one line\nnext <para> Red kept\n  as is"
    parsed = corpus("enriched_nextmail.eml")
    assert "since the update on Thursday the mail server rejects my password, although" in parsed.text
    assert "<bold>" not in parsed.text and parsed.attachments == []


def test_richtext_is_converted_and_its_comments_dropped():
    assert richtext_to_text("a <bold>b</bold>\r\nc<nl>d <lt>e><comment>x</comment><np>f") == "a b c\nd <e>\n\nf"
    parsed = corpus("richtext_eudora.eml")
    assert "Pacific time <UTC-8>" in parsed.text and "Eudora richtext" not in parsed.text


def test_application_plain_signed_content_is_the_body_and_its_signature_recorded():
    parsed = corpus("pgp_signed_application_plain.eml")
    assert "expires on Monday 11 March" in parsed.text
    assert parsed.attachments == [] and [s["protocol"] for s in parsed.signatures] == ["pgp"]


def test_another_text_type_without_a_filename_is_body_text_but_a_calendar_stays_a_file():
    raw = mail(
        "From: a@example.com",
        "MIME-Version: 1.0",
        'Content-Type: multipart/mixed; boundary="b"',
        body="--b\r\nContent-Type: text/x-log\r\n\r\nsegfault at 0x0\r\n--b\r\n"
        "Content-Type: text/calendar; method=REPLY\r\n\r\nBEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n--b--\r\n",
    )
    parsed = parse_message(raw)
    assert parsed.text == "segfault at 0x0"
    assert [a.declared_type for a in parsed.attachments] == ["text/calendar"]


def test_a_raw_comma_inside_an_encoded_word_does_not_split_the_address_list():
    parsed = corpus("outlook_mueller_comma_name.eml")
    assert (parsed.sender, parsed.sender_name) == ("a.mueller@example.de", "Müller, Andreas")
    assert parse_address_list("=?utf-8?Q?Doe,_Jane?= <j@example.com>, b@example.org") == [
        ("=?utf-8?Q?Doe,_Jane?=", "j@example.com"),
        ("", "b@example.org"),
    ]


def test_a_quoted_pair_does_not_end_a_comment():
    parsed = corpus("comment_quoted_paren_sender.eml")
    assert (parsed.sender, parsed.sender_name) == ("noc@example.org", "Network Ops (24x7), Site B")


def test_filenames_keep_inner_whitespace_and_rfc_2231_names_survive_a_wrong_charset():
    assert [a.filename for a in corpus("filename_double_space.eml").attachments] == [
        "Quote  2024-031  badge readers.pdf"
    ]
    assert [a.filename for a in corpus("rfc2231_name_charset_mismatch.eml").attachments] == [
        "Prüfbericht Störung März.pdf",
        "Messprotokoll Größe Übersicht.pdf",
    ]


def test_delimiter_lines_of_a_malformed_multipart_stay_out_of_the_body():
    assert corpus("broken_boundary_no_close.eml").text.endswith("with two different chargers.")
    raw = mail(
        "From: a@example.com",
        "MIME-Version: 1.0",
        'Content-Type: multipart/mixed; boundary="declared"',
        body="--used-instead\r\nContent-Type: text/plain\r\n\r\nthe real text\r\n--used-instead--\r\n",
    )
    parsed = parse_message(raw)
    assert parsed.text == "the real text" and "BoundaryMismatch" in parsed.defects


def test_a_raw_gb2312_subject_is_not_read_in_the_latin_charset_of_a_spam_report():
    parsed = corpus("spamassassin_report_gb2312_subject.eml")
    assert parsed.subject == "关于服务器无法登录的问题"
    assert [a.filename for a in parsed.attachments] == ["关于服务器无法登录的问题.eml"]


def test_a_raw_shift_jis_subject_is_read_although_the_body_is_iso_2022_jp():
    assert corpus("php_form_sjis_subject.eml").subject == "お問い合わせ：ログインできません"


def test_the_short_text_detector_keeps_latin_and_cyrillic_single_byte_text():
    assert charsets.decode("Größe".encode("cp1252"), None, "iso-8859-1") == "Größe"
    assert charsets.decode("Не работает".encode("koi8_r"), None, "koi8-r") == "Не работает"
    assert charsets.decode("Ελλάδα".encode("iso8859_7"), None, "iso-8859-7") == "Ελλάδα"
    assert charsets.decode("로그인 문제".encode("euc-kr"), None, None) == "로그인 문제"
    assert not charsets.reads_8bit("iso-2022-jp") and not charsets.reads_8bit("utf-7")


def test_deliverable_odd_senders_are_kept():
    assert corpus("sender_trailing_dot.eml").sender == "greta.lind@example.com"
    assert corpus("sender_quoted_local_part.eml").sender == '"john smith"@example.com'
    dotless = corpus("sender_dotless_intranet.eml")
    assert dotless.sender == "root@nagios01" and "DotlessSenderDomain" in dotless.defects
    assert is_valid_address('"john smith"@example.com') and not is_valid_address("root@nagios01")
    assert is_valid_address("root@nagios01", allow_dotless=True)


def test_a_raw_utf8_address_comes_out_as_unicode():
    parsed = corpus("rfc6532_utf8_sender.eml")
    assert (parsed.sender, parsed.sender_name) == ("josé@exämple.es", "José Núñez")
    assert parsed.message_id == "a1b2c3d4-e5f6-4711-8000-000000000001@exämple.es"


def test_smime_certificates_only_is_a_file_and_said_so_not_encrypted():
    parsed = corpus("smime_certs_only.eml")
    assert parsed.smime_certs_only and parsed.encrypted == ""
    assert [(a.filename, a.declared_type) for a in parsed.attachments] == [("smime.p7c", "application/pkcs7-mime")]
    assert cms.is_certs_only(attachment_payload(parsed, 0))


def test_an_smime_signature_in_multipart_mixed_is_a_signature_not_an_attachment():
    parsed = corpus("smime_p7s_in_mixed.eml")
    assert parsed.attachments == [] and [s["protocol"] for s in parsed.signatures] == ["smime"]
    assert not cms.is_certs_only(attachment_payload(corpus("smime_certs_only.eml"), 0)[:40])


def test_raw_cjk_names_and_an_undeclared_short_body_are_read_despite_a_latin_report_part():
    name = "服务器日志.txt".encode("gb2312")
    raw = (
        b"From: li.ming@example.cn\r\nSubject: logs\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b"\r\n\r\n'
        b"--b\r\nContent-Type: text/plain; charset=iso-8859-1\r\n\r\nRapport \xe9t\xe9\r\n"
        b"--b\r\nContent-Type: text/plain\r\n\r\n" + "无法登录服务器".encode("gb2312") + b"\r\n"
        b'--b\r\nContent-Type: application/octet-stream; name="' + name + b'"\r\n\r\nx\r\n--b--\r\n'
    )
    parsed = parse_message(raw)
    assert [a.filename for a in parsed.attachments] == ["服务器日志.txt"]
    assert parsed.text == "Rapport été\n\n无法登录服务器"
