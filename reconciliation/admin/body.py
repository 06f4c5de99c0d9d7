"""An item's message body and attachments (`BodyViewsMixin`, mixed into `RecoveryItemAdmin`).

URLs: `<pk>/body/` and `<pk>/attachment/<index>/`. Reading a body or a file is
a permission of its own and audited (`reconciliation.services.bodies`).

A long text is folded: the first `FOLD_LINES` lines (at most `FOLD_CHARS` characters) are shown and
the rest sits in a <details> element ("Show all"), so a 273 KB body is not one 34,000 px block and
the page needs no script (the Content-Security-Policy allows none inline).
"""

from dataclasses import dataclass

from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import services
from ..downloads import attachment_response

FOLD_LINES = 200
FOLD_CHARS = 20_000
# How each alternative's type reads on the page (HTML is only ever shown as text).
TEXT_SOURCES = {
    "plain": "Read from the plain-text part.",
    "html": "Converted from the HTML part to text (never shown as HTML).",
    "plain+html": "Read from the plain-text and HTML parts (HTML converted to text).",
}


@dataclass
class FoldedText:
    """A text cut for the page: `head` always shown, `rest` behind "Show all" ("" when it all fits)."""

    head: str
    rest: str
    lines: int
    size: int  # bytes as UTF-8

    @property
    def hidden_lines(self) -> int:
        return self.rest.count("\n") + 1 if self.rest else 0


def fold(text: str, *, max_lines: int = FOLD_LINES, max_chars: int = FOLD_CHARS) -> FoldedText:
    """The first `max_lines` lines of `text`, cut to `max_chars` at a line end when one is near."""
    head = "\n".join(text.split("\n", max_lines)[:max_lines])
    if len(head) > max_chars:
        cut = head.rfind("\n", max_chars // 2, max_chars)
        head = head[: cut if cut > 0 else max_chars]
    rest = text[len(head) :]
    if not rest.strip():
        head, rest = text, ""
    return FoldedText(
        head=head,
        rest=rest.removeprefix("\n"),
        lines=text.count("\n") + 1 if text else 0,
        size=len(text.encode("utf-8", "replace")),
    )


class BodyViewsMixin:
    """Expects `event_or_404(request, pk)` (ItemPageMixin) on the same admin."""

    def body_view(self, request, pk):
        event = self.event_or_404(request, pk)
        body = services.do_view_message_body(request.user, event.pk)  # PermissionDenied -> 403; audited
        alternatives = [(kind, fold(text)) for kind, text in body.alternatives]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Item #{event.pk}: message body",
            "event": event,
            "body": body,
            "text": fold(body.text),
            "text_source": TEXT_SOURCES.get(body.text_source, ""),
            "alternatives": alternatives if len(alternatives) > 1 else [],
            "detail_url": reverse("admin:reconciliation_recoveryitem_change", args=[event.pk]),
        }
        response = TemplateResponse(request, "admin/reconciliation/recoveryitem/body.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def attachment_view(self, request, pk, index):
        event = self.event_or_404(request, pk)
        try:
            attachment, payload = services.do_download_attachment(request.user, event.pk, index)
        except services.ActionRefused:
            raise Http404("no such attachment") from None
        return attachment_response(attachment.filename, payload, index=int(index))
