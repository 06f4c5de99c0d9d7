"""The body as HTML for desks that take it: the message's HTML sanitized by nh3 (Rust's ammonia: an
allow-list of tags and attributes, scripts, styles, event handlers and foreign schemes removed), with
`cid:` images kept as `cid:` for the adapter to point at its uploaded files (`resolve_cid`).

nh3 was chosen over bleach (deprecated in 2023 in its favour) and hand-written filtering: it parses
HTML as browsers do, so a malformed tag cannot smuggle a script past it.
"""

import re

import nh3

MAX_HTML_CHARS = 500_000
ALLOWED_TAGS = {
    "a",
    "abbr",
    "b",
    "blockquote",
    "br",
    "caption",
    "code",
    "col",
    "colgroup",
    "dd",
    "del",
    "div",
    "dl",
    "dt",
    "em",
    "font",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "i",
    "img",
    "ins",
    "li",
    "ol",
    "p",
    "pre",
    "q",
    "s",
    "small",
    "span",
    "strike",
    "strong",
    "sub",
    "sup",
    "table",
    "tbody",
    "td",
    "tfoot",
    "th",
    "thead",
    "tr",
    "u",
    "ul",
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "td": {"colspan", "rowspan", "align", "valign"},
    "th": {"colspan", "rowspan", "align", "valign", "scope"},
    "font": {"color"},
    "*": {"dir", "lang"},
}
# Remote images are tracking pixels and leak who reads the ticket; only attached ones (cid:) are kept.
URL_SCHEMES = {"http", "https", "mailto", "cid"}
CID_SRC = re.compile(r'src="cid:([^"]+)"', re.IGNORECASE)


def _keep_attribute(element: str, attribute: str, value: str):
    if element == "img" and attribute == "src" and not value.lower().startswith("cid:"):
        return None
    return value


def sanitized_html(html: str) -> str:
    """Safe HTML for a desk's ticket body; "" when nothing readable is left."""
    if not html or not html.strip():
        return ""
    clean = nh3.clean(
        html[:MAX_HTML_CHARS],
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        attribute_filter=_keep_attribute,
        strip_comments=True,
    )
    return clean.strip()


def content_ids(html: str) -> set[str]:
    """The Content-IDs an HTML body shows inline."""
    return {match.strip("<>") for match in CID_SRC.findall(html or "")}


def resolve_cid(html: str, urls: dict[str, str]) -> str:
    """`html` with each `cid:<id>` image pointing at `urls[id]` (the desk's URL of the uploaded file); an image
    whose file is not on the desk is dropped rather than left broken."""

    def replace(match):
        url = urls.get(match.group(1).strip("<>"))
        return f'src="{url}"' if url else 'src=""'

    return CID_SRC.sub(replace, html or "")
