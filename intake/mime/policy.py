"""The email package's `policy.default`, made lazy: reading a header gives its raw unfolded string.

`PARSE_POLICY` parses; `GENERATE_POLICY` writes an attached message back out.
"""

from __future__ import annotations

import re
from email.policy import EmailPolicy

_LINESEP = re.compile(r"\r\n|\r|\n")
PARAMETER_HEADERS = frozenset({"content-type", "content-disposition"})
MAX_PARAMETER_HEADER_CHARS = 8192
MAX_PARAMETERS = 64


class _LazyHeaderPolicy(EmailPolicy):
    """`policy.default`, except that reading a header returns its raw, unfolded string.

    Everything `Message` itself does with headers (content type, boundary,
    parameters, filename, charset) works on strings, which is what compat32
    hands it too; `EmailMessage` helpers that need header objects
    (`is_attachment`, `get_body`, `iter_attachments`, `get_content`) are not
    used here.
    """

    def header_fetch_parse(self, name: str, value: str) -> str:
        if hasattr(value, "name"):
            return value
        if name.lower() in PARAMETER_HEADERS:
            # email.message._parseparam is quadratic in the length and in the number of ";",
            # and the parser itself calls it (get_boundary) on every multipart part.
            if len(value) > MAX_PARAMETER_HEADER_CHARS:
                value = value[:MAX_PARAMETER_HEADER_CHARS]
            if value.count(";") > MAX_PARAMETERS:
                value = ";".join(value.split(";", MAX_PARAMETERS + 1)[: MAX_PARAMETERS + 1])
        return _LINESEP.sub("", value)


PARSE_POLICY = _LazyHeaderPolicy()
# Writing an attached message back out: never refold (refolding goes through the
# structured header classes, which are slow on huge headers and have raised on odd ones).
GENERATE_POLICY = PARSE_POLICY.clone(refold_source="none")
