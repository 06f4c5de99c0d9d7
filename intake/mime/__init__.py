"""MIME parsing for intake: headers, a readable text body and the attachments.

    parse_message(raw, *, loop_header="X-Mailroom-Loop") -> ParsedMessage
    iter_attachment_payloads(parsed) -> Iterator[(Attachment, bytes)]
    attachment_payload(parsed, index) -> bytes
    iter_attachment_files(parsed, *, spool_threshold) -> Iterator[(Attachment, binary file)]
    attachment_file(parsed, index, *, spool_threshold) -> binary file (the caller closes it)

`parse_message` never raises. Hostile or broken mail degrades to best effort:
empty fields where nothing usable was found, the parser's defects kept in
`ParsedMessage.defects` (for review to show), and `ParsedMessage.too_complex`
set when a limit below stopped the walk (validation sends such mail to review,
because parts that were not looked at were not checked either).

Limits (constants, importable from here): multipart nesting examined
`MAX_DEPTH` (32), MIME parts examined `MAX_PARTS` (2,000; a message with more
than `MAX_BOUNDARY_LINES` lines starting with "--" gets its headers parsed only),
header value characters decoded `MAX_HEADER_CHARS` (64 Ki; Content-Type and
Content-Disposition are cut to 8 Ki and 64 parameters before the email package
reads them, because its parameter parser is quadratic), text body
`MAX_DESCRIPTION_CHARS` (1 Mi characters, from at most `MAX_TEXT_BYTES` of a
plain part and `MAX_HTML_BYTES` of an HTML one), attachment bytes sniffed
`SNIFF_BYTES` (8 KiB), a winmail.dat as `intake.mime.tnef` allows.
Parsing cost is linear in the input: ~0.2 ms for a 2 KB message, ~1.2 s for a
25 MB message that is one base64 attachment (the stdlib parser reads line by
line), up to ~0.5 s a MB for input built to be slow (a million header lines).

How it stays fast: the standard `email` package with `policy.default`
semantics (EmailMessage objects, RFC 2231 parameters, 8-bit clean), except
that reading a header returns the raw unfolded string instead of building a
structured header object (`_LazyHeaderPolicy`, `intake.mime.policy`). With
header objects (the first version of this parser) a 2.4 KB message took
~1.2 ms, mostly in header classes we do not need; now ~0.15-0.25 ms. The few
fields we use are decoded by `intake.mime.headers`, leniently, as mail
clients read them: the header block is first repaired
(`intake.mime.headerblock`: a byte-order mark or junk before the headers, unindented continuations,
stray lines, `Subject : x`), addresses are read by `intake.mime.addresses`
(never joined across spaces, an RFC 2047 word one word whatever it holds, quoted
pairs kept inside comments, a domain's trailing dot dropped; sender = first valid
From address, else Sender, else Reply-To, where a quoted local part counts and a
dotless intranet domain counts too, flagged `DotlessSenderDomain`), and text by
`intake.mime.charsets` (RFC 2047 words joined as
bytes, charset aliases such as gb2312 -> gb18030, raw 8-bit
headers as UTF-8, else the charset of the first text part that can hold 8-bit
bytes (not us-ascii, iso-2022-*, utf-7), a detector among the CJK encodings
before a single-byte hint wins, cp1252).

Body text: text/plain and text/html parts without a filename and not marked
`attachment` (a Content-Type too malformed to parse that still begins with
text/plain or text/html counts as that type, its charset read from the raw
header), and so are other text types without a filename (text/enriched and
text/richtext converted by `intake.mime.richtext`, application/plain, any other
text/* but calendars, contact cards, CSS and scripts); delimiter lines that a
malformed multipart leaves in a text part are dropped, and a multipart whose
declared boundary never shows is read with the one its body uses
(`intake.mime.messageparts`); in multipart/alternative the plain part unless it is blank or a stub
of the HTML one ("view this email in your browser", or under 40 % of the HTML
text: `intake.mime.alternatives`), then the HTML one (converted by
`intake.mime.htmltext`). Every alternative is recorded in `alternatives` as
{"type", "chars", "chosen"}; "chars" is None for a part not read (an HTML part
is converted only when the plain one might be a stub). Several inline text
parts (as Apple Mail sends around inline images) are joined. If none is found,
an inline text part that has a filename ("inline; filename=msg.txt") is used,
and stays an attachment too; then the body inside a winmail.dat (`body_source`
"rtf" when it came from its RTF). Text longer than `MAX_DESCRIPTION_CHARS`, or
whose part was longer than what is read, is cut at a paragraph boundary
(`intake.mime.texttrim`), never mid-sentence, and `text_truncated` is set.

Signed and encrypted mail: in multipart/signed the content is walked as usual
and the signature part (application/pgp-signature, application/pkcs7-signature,
application/x-pkcs7-signature; an S/MIME one, or smime.p7s, also outside
multipart/signed) is recorded in `signatures` ({"protocol":
"pgp"|"smime", "type", "size", "sha256"}), not listed as an attachment;
nothing is verified. S/MIME opaque signed data (application/pkcs7-mime with
smime-type=signed-data, or whose content says so) is unwrapped (`intake.mime.cms`)
and the MIME entity inside walked in its place, the blob recorded as a
signature; signed data that cannot be unwrapped is treated as encrypted, so a
person looks. Encrypted mail: multipart/encrypted (PGP/MIME), pkcs7-mime
enveloped-data or authEnveloped-data (or without smime-type and named
smime.p7m), or a body that is one inline "BEGIN PGP MESSAGE" block, sets
`encrypted` ("pgp" or "smime"), also when it is inside an attached message;
the ciphertext parts are attachments with `origin="encrypted"` (the PGP/MIME
"Version: 1" control part is not). Inline PGP signed text is ordinary text.

Attachments: every leaf part that is not body text (nor a signature) is an
`Attachment`, with its size, sha256, the declared Content-Type and the type
sniffed from its first bytes by libmagic (python-magic), refined for
containers: a ZIP that holds `[Content_Types].xml` and a Word/Excel/PowerPoint
main part is given the matching OOXML type, an OpenDocument ZIP its
`mimetype`, and any OOXML ZIP with a `vbaProject.bin`, or an OLE (legacy
Office) file with a VBA project, gets `MACRO_OFFICE_TYPE`; an attached message
is sniffed as message/rfc822 from its header block, an S/MIME signature as
application/pkcs7-signature (`intake.mime.sniff`). Containers are listed with
their contents: an archive (zip, 7z, gzip, bzip2, tar; `intake.mime.archives`)
or an Outlook .msg (`intake.mime.outlookmsg`) stays one attachment, and the
files inside follow it with `nested=True` and origin "archive"/"outlook"
("encrypted" for an encrypted member; `intake.mime.containers`), so the policy
judges and clamd scans each; `Attachment.contents` says "listed", "encrypted" or
"unreadable" (which sets `too_complex`: a person looks). Limits: those modules.
An attached message (`message/rfc822`, `message/global`, `message/news`) is one
attachment (its re-serialized bytes), and the attachments inside it are
listed too, with `nested=True`, so that the attachment policy sees every file
in the mail; a message/news that is the only content also gives the body text.
message/partial pieces all present in the mail are reassembled into one
attached message (whose text is the body if there is no other); a piece
without its siblings is a file ("partial 1 of 3.eml"). message/external-body
is a line of text ("External file: <where> (<type>; access-type ...; size ...;
expires ...)", `intake.mime.external`), never fetched. S/MIME certificates
only (smime-type=certs-only, or signed data without content and signers) is a
file, application/pkcs7-mime, and sets `smime_certs_only`.
Names: the Content-Disposition filename, else the Content-Type name (RFC 2231
continuations and charsets, its bytes read as text is read: valid UTF-8 first,
a wrong declared charset replaced; or RFC 2047 words; whitespace inside kept,
only the ends stripped), else the last segment of Content-Location; an attached message without one is
"<subject>.eml"; a name used twice becomes "report (2).pdf". A winmail.dat
(application/ms-tnef, application/vnd.ms-tnef, or so named) is listed as the
files inside it (`intake.mime.tnef`, `origin="tnef"`), sniffed, checked and scanned
like any other; one that cannot be unpacked stays listed as itself, a type the
default policy refuses, so a person looks at it. Payloads are not kept:
`iter_attachment_payloads` decodes them again, one at a time, from the parsed
message that `ParsedMessage` holds (a winmail.dat is unpacked again).
Large base64 parts are never copied into the parsed message: their encoded
lines stay in the raw bytes and are decoded from there, a block at a time,
into a spooled temporary file (`iter_attachment_files`, `attachment_file`)
or hashed and sniffed on the way (`intake.mime.spool`).

The modules of this package, one concern each:

    message      ParsedMessage and Attachment, DEFAULT_LOOP_HEADER
    parse        parse_message: the entry point, never raises
    policy       the lazy header policy the email package parses with
    headers      header text decoding (decode_header_value, decode_bytes), ids,
                 addresses, the header fields of ParsedMessage, thread_ids
    walk         the part walk: body, attachments, signed and encrypted parts, winmail.dat
    body         body text of one part, and the choice among alternatives
    parts        one part's bytes, type and name; attachment listing and payloads
                 (attachment_payload, iter_attachment_payloads)
    sniff        sniff_type: libmagic, refined for Office (MACRO_OFFICE_TYPE, OOXML_TYPES),
                 attached messages, signatures, certificates, Outlook .msg
    archives     the members of zip, 7z, gzip, bzip2 and tar files, bounded
    outlookmsg   unpacking an Outlook .msg (extract-msg), bounded
    containers   listing a container's members after it; reading them again for the scanner
    calendar     the iTIP method of a message's calendar part (meeting replies)
    headerblock  repairing a broken header block
    addresses    lenient address lists
    charsets     charset labels and decoding, RFC 2047 words
    alternatives whether a plain alternative is a stub of the HTML one
    htmltext     linear-time HTML to text
    texttrim     cutting text at a paragraph boundary
    cms          S/MIME (CMS) content kinds, signed content, certificates only
    richtext     text/enriched and text/richtext to plain text
    external     the text line of a message/external-body pointer
    messageparts message/partial reassembly; malformed multipart delimiters
    tnef         unpacking a winmail.dat
    spool        large base64 parts left in the raw bytes, decoded to spooled files
"""

from .body import MAX_DESCRIPTION_CHARS, MAX_HTML_BYTES, MAX_TEXT_BYTES
from .headers import (
    MAX_HEADER_BLOCK_FOR_IDS,
    MAX_HEADER_CHARS,
    MAX_HEADER_INSTANCES,
    MAX_HINT_PARTS,
    MAX_REFERENCES,
    decode_bytes,
    decode_header_value,
    thread_ids,
)
from .limits import MAX_ALTERNATIVES, MAX_BOUNDARY_LINES, MAX_DEPTH, MAX_PARTS, MAX_SIGNATURES
from .message import DEFAULT_LOOP_HEADER, MAX_DEFECTS, Attachment, ParsedMessage
from .parse import parse_message
from .parts import (
    MAX_EML_NAME_CHARS,
    attachment_file,
    attachment_payload,
    iter_attachment_files,
    iter_attachment_payloads,
)
from .policy import MAX_PARAMETER_HEADER_CHARS, MAX_PARAMETERS
from .sniff import MACRO_OFFICE_TYPE, OOXML_TYPES, SNIFF_BYTES, sniff_type

__all__ = [
    "parse_message",
    "ParsedMessage",
    "Attachment",
    "iter_attachment_payloads",
    "attachment_payload",
    "thread_ids",
    "iter_attachment_files",
    "attachment_file",
    "decode_header_value",
    "decode_bytes",
    "sniff_type",
    "MACRO_OFFICE_TYPE",
    "OOXML_TYPES",
    "DEFAULT_LOOP_HEADER",
    "SNIFF_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_HTML_BYTES",
    "MAX_TEXT_BYTES",
    "MAX_HEADER_BLOCK_FOR_IDS",
    "MAX_HEADER_CHARS",
    "MAX_HEADER_INSTANCES",
    "MAX_HINT_PARTS",
    "MAX_REFERENCES",
    "MAX_DEFECTS",
    "MAX_EML_NAME_CHARS",
    "MAX_PARAMETER_HEADER_CHARS",
    "MAX_PARAMETERS",
    "MAX_ALTERNATIVES",
    "MAX_BOUNDARY_LINES",
    "MAX_DEPTH",
    "MAX_PARTS",
    "MAX_SIGNATURES",
]
