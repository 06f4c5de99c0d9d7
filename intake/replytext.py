"""The new text of a reply: quoted history and signatures removed.

`reply_text(parsed) -> str` is what a reply adds to a ticket that already
holds the earlier messages. It never returns "" for a message that has text:
when stripping would leave nothing, the full text is returned. Normalization
stores the result in `event.details["reply_text"]`, so every attempt sends
the same comment; the full message stays in the stored raw MIME.

Library: `mail-parser-reply` (mailparser_reply), not `quotequail`.
- It splits a body at reply headers in many languages (English, German,
  French, Italian, Swedish, Danish, Czech, Japanese, Korean, ...), including
  Outlook's header blocks ("From: / Sent: / To: / Subject:", "Von: /
  Gesendet: / An: / Betreff:", "发件人: / 发送时间: ...") with or without a
  "-----Original Message-----" or underscore line above them. quotequail finds
  "On ... wrote:" lines and forward separators in a few Western languages but
  neither header blocks without a separator (in `quote`), nor any CJK client,
  nor signatures.
- Its tables are plain regular expressions, so what it misses is added here,
  in the same style: `_EXTRA_HEADERS` (checked against 1.36: its Spanish
  "El ... escribió:", Dutch "Op ... schreef <name>:", Chinese "...写道："
  patterns never match, and Foxmail/QQ's full-width colons and
  "原始邮件" separator are not known).
What we do not take from it: its sign-off detection ("Thanks,", "Best,",
"/name", "- item" lines end the message in its eyes) and its disclaimer
removal (a line starting "Warning:" or "Confidential:" that mentions mail).
Both drop text customers really write ("Thanks, but it still fails: ...").
Signatures are cut only at the RFC 3676 delimiter ("-- ") and at a
"Sent from my iPhone"-style line (`_SENT_FROM`), the two unambiguous cases.

Text that came from HTML (no plain part): Gmail, Thunderbird, Yahoo and
Outlook on the web mark the quoted history in the markup (`gmail_quote`,
`moz-cite-prefix`, `yahoo_quoted`, `divRplyFwdMsg`, `<blockquote
type="cite">`); the HTML is cut there before it is converted, then the text
rules above run on what is left.

A forward is not a reply: when the part we would keep holds a forward
separator ("---------- Forwarded message ---------", "Begin forwarded
message:"), the forwarded message is the content, and the full text is kept.

Hostile input: the library's patterns backtrack (a 60 KB line of "On On On"
took ~60 s, 64 KB of blank lines minutes), and any sender can write that. The
library therefore only sees a bounded copy of the text (`_probe`: lines cut
to 256 characters, runs of blank lines and spaces shortened), and the lines it
picks are mapped back to the original text; our own patterns are linear.
"""

import re

from mailparser_reply import EmailReplyParser

from .mime import MAX_HTML_BYTES, ParsedMessage, decode_bytes
from .mime.htmltext import html_to_text

# Languages whose reply headers the library looks for. Polish is left out: its
# header pattern fires on a single line starting "Data:", "Do:" or "Od:".
LANGUAGES = ("en", "de", "fr", "es", "nl", "it", "sv", "da", "cs", "zh", "ja", "ko")

_Q = r"(?:> ?)*"  # a line may sit inside quotation levels
_EXTRA_HEADERS = re.compile(
    "|".join(
        [
            # Spanish (Gmail, Apple Mail): "El lun, 4 mar 2024 a las 10:15, Ana (<ana@x>) escribió:"
            rf"^{_Q}El\s.+\sescribi[óo]\s?:\s*$",
            # Dutch: Gmail "Op ma 4 mrt 2024 om 10:15 schreef Jan <jan@x>:",
            # Apple "... heeft Jan het volgende geschreven:"
            rf"^{_Q}Op\s.+\sschreef\s.*:\s*$",
            rf"^{_Q}Op\s.+\sheeft\s.+\sgeschreven\s?:\s*$",
            # Portuguese: "Em seg., 4 de mar. de 2024 às 10:15, Ana <ana@x> escreveu:"
            rf"^{_Q}Em\s.+\sescreveu\s?:\s*$",
            # Chinese: Gmail "2024年3月4日周一 10:15，Ann <ann@x> 写道：", NetEase/QQ "在 2024-03-04 ..."写道："
            rf"^{_Q}.{{0,300}}(?:写道|寫道)\s*[:：]\s*$",
            # Outlook-style separators the library does not know in every language
            rf"^{_Q}[-_]{{2,}}\s*(?:Original Message|Ursprüngliche Nachricht|Message d'origine|Mensaje original"
            rf"|Messaggio originale|Oorspronkelijk bericht|Mensagem original|原始邮件|原始郵件|元のメッセージ)"
            rf"\s*[-_]{{2,}}\s*$",
            # Chinese header blocks with full-width colons (Foxmail, QQ Mail, Outlook zh-CN/zh-TW)
            rf"^{_Q}(?:发件人|寄件者|寄件人)\s*[:：].*\n{_Q}(?:发送时间|發送時間|日期|时间|時間|寄件日期|收件人|收件者|主题|主旨)\s*[:：]",
        ]
    ),
    re.MULTILINE | re.IGNORECASE,
)

# The line a forwarded message starts with: what follows is content, not history.
_FORWARD = re.compile(
    r"^[ \t>]*(?:-{2,}[ \t]*(?:Forwarded message|Forwarded Message|Weitergeleitete Nachricht|Message transféré"
    r"|Mensaje reenviado|Doorgestuurd bericht|Messaggio inoltrato|转发邮件|轉寄郵件)[ \t]*-{2,}"
    r"|Begin forwarded message\s*:|Anfang der weitergeleiteten (?:Nachricht|E-Mail)\s*:"
    r"|Début du message réexpédié\s*:|Inicio del mensaje reenviado\s*:|Begin doorgestuurd bericht\s*:)[ \t]*$",
    re.MULTILINE | re.IGNORECASE,
)

# "-- " (RFC 3676), or "--" as some clients (and editors trimming lines) leave it.
_SIGNATURE_DELIMITER = re.compile(r"^--[ \t]*$", re.MULTILINE)
# A line of its own, short, at the end of what the sender typed.
_SENT_FROM = re.compile(
    r"^(?:Sent from (?:my |Mail for |Outlook|Yahoo|Samsung|ProtonMail|Proton Mail)|Get Outlook for "
    r"|Von meinem .{1,40} gesendet|Gesendet von meinem |Gesendet mit |Envoyé de mon |Envoyé depuis mon "
    r"|Enviado desde mi |Enviado do meu |Inviato da(?:l mio)? |Verzonden (?:vanaf|met) mijn |Verstuurd vanaf mijn "
    r"|Skickat från min |Sendt fra min |从我的.{1,20}发送|发自我的|寄件者為我的|iPhoneから送信|.{1,20}から送信"
    r"|내 .{1,20}에서 보냄).{0,80}$",
    re.MULTILINE | re.IGNORECASE,
)

# Markers of the quoted history in HTML (lowercase), found with str.find: linear on any input.
_HTML_QUOTE_MARKERS = (
    "gmail_quote",
    "moz-cite-prefix",
    "yahoo_quoted",
    "divrplyfwdmsg",
    "appendonsend",
    'type="cite"',
    "type='cite'",
    "type=cite",
)
_QUOTE_TAG = re.compile(r"<(?:div|blockquote)\b", re.IGNORECASE)

_parser = EmailReplyParser(languages=list(LANGUAGES))

PROBE_LINE_CHARS = 256
_LONG_SPACE = re.compile(r"\s{3,}")
_RULE = re.compile(r"[_-]{32,}")


def _html_part(parsed: ParsedMessage) -> str | None:
    """The one HTML body part the text was converted from, decoded; None when there is not exactly one."""
    message = getattr(parsed, "_message", None)
    if message is None or parsed.body_source != "html":
        return None
    found = []
    try:
        for part in message.walk():
            if part.get_content_type() != "text/html" or part.get_content_disposition() == "attachment":
                continue
            if part.get_filename():
                continue
            found.append(part)
            if len(found) > 1:
                return None
        if not found:
            return None
        data = found[0].get_payload(decode=True)
        if not isinstance(data, bytes):
            return None
        return decode_bytes(data[:MAX_HTML_BYTES], found[0].get_content_charset())
    except Exception:
        return None


def _html_quote_start(html: str) -> int | None:
    """Where the first `<div>`/`<blockquote>` carrying a quote marker starts, or None."""
    lowered = html.lower()
    best = None
    for marker in _HTML_QUOTE_MARKERS:
        at = lowered.find(marker)
        while at >= 0 and (best is None or at < best):
            tag = lowered.rfind("<", max(0, at - 2000), at)
            if tag >= 0 and ">" not in lowered[tag:at] and _QUOTE_TAG.match(lowered, tag):
                best = tag
                break
            at = lowered.find(marker, at + len(marker))
    return best


def _text_without_html_quote(parsed: ParsedMessage) -> str | None:
    """The text of the HTML body above its quoted history, or None when there is no marked quote."""
    html = _html_part(parsed)
    if not html:
        return None
    start = _html_quote_start(html)
    if start is None:
        return None
    quoted = html_to_text(html[start : start + 20000], max_chars=2000)
    if _FORWARD.search(quoted[:500]):
        return None
    return html_to_text(html[:start])


def _probe(lines: list[str]) -> tuple[list[str], list[int]]:
    """What the library is shown, and for each of its lines the index of the original line.

    The library's patterns backtrack: on a long line starting "On ", on a long run
    of blank lines or of white space they take seconds to minutes, and any sender
    can write such a message. A reply header is a short line, so the library sees
    every line cut to `PROBE_LINE_CHARS`, white space runs shortened, runs of
    blank lines as one, and no separator lines of 32 "_" or "-" (the library
    deletes those itself, which would shift its lines against ours).
    """
    probe, origin = [], []
    for index, line in enumerate(lines):
        line = _LONG_SPACE.sub("  ", line[:PROBE_LINE_CHARS].strip())
        if _RULE.match(line):
            line = ""
        if not line and probe and not probe[-1]:
            continue
        probe.append(line)
        origin.append(index)
    return probe, origin


def _reply_lines(lines: list[str]) -> tuple[int, int]:
    """[start, end) of the original lines that hold the newest reply."""
    probe, origin = _probe(lines)
    text = "\n".join(probe)
    start, end = 0, len(probe)
    extra = _EXTRA_HEADERS.search(text)
    if extra is not None:
        if text[: extra.start()].strip():
            end = text.count("\n", 0, extra.start())
        else:  # bottom-posted (history first, the answer below): drop only the intro line(s)
            start = text.count("\n", 0, extra.end()) + 1
    message = _parser.read("\n".join(probe[start:end]))
    body = message.text  # the library's view: the same lines, each stripped
    replies = message.replies
    if replies:
        first = replies[0]
        first_start, after = 0, 0
        if first.headers:
            at = body.find(first.headers)
            if at >= 0:
                after = at + len(first.headers)
                first_start = body.count("\n", 0, after) + 1
        first_end = end - start
        if len(replies) > 1 and replies[1].headers:
            at = body.find(replies[1].headers, max(after, 1))
            if at >= 0:
                first_end = body.count("\n", 0, at)
        start, end = start + first_start, start + max(first_start, first_end)
    to_original = origin + [len(lines)]
    return to_original[min(start, len(probe))], to_original[min(end, len(probe))]


def _cut_quotes(text: str) -> str:
    lines = text.split("\n")
    start, end = _reply_lines(lines)
    kept = lines[start:end]
    while kept and (not kept[-1].strip() or _RULE.match(kept[-1].strip())):
        kept.pop()  # the separator line above an Outlook header block
    return "\n".join(kept)


def _drop_quoted_lines(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith(">"))


def _cut_signature(text: str) -> str:
    cuts = [m.start() for m in (_SIGNATURE_DELIMITER.search(text), _SENT_FROM.search(text)) if m]
    if not cuts:
        return text
    kept = text[: min(cuts)]
    return kept if kept.strip() else text


def _tidy(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def strip_reply(text: str) -> str:
    """`reply_text` for a plain string."""
    if not text or not text.strip():
        return text or ""
    try:
        kept = _cut_quotes(text)
        if _FORWARD.search(kept):
            return text.strip()
        kept = _tidy(_cut_signature(_drop_quoted_lines(kept)))
    except Exception:  # a regex surprise must not lose the message
        return text.strip()
    return kept or text.strip()


def reply_text(parsed: ParsedMessage) -> str:
    """The new text of the reply `parsed`: no quoted history, no signature. Never "" when it had text."""
    full = parsed.text or ""
    if not full.strip():
        return full
    above_quote = _text_without_html_quote(parsed)
    if above_quote and above_quote.strip():
        kept = strip_reply(above_quote)
    else:
        kept = strip_reply(full)
    return kept if kept.strip() else full.strip()
