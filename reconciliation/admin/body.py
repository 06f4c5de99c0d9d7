"""An item's message body and attachments (`BodyViewsMixin`, mixed into `RecoveryItemAdmin`).

URLs: `<pk>/body/` and `<pk>/attachment/<index>/`. Reading a body or a file is
a permission of its own and audited (`reconciliation.services.bodies`).
"""
from django.http import Http404, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import services


class BodyViewsMixin:
    """Expects `event_or_404(request, pk)` (ItemPageMixin) on the same admin."""

    def body_view(self, request, pk):
        event = self.event_or_404(request, pk)
        body = services.do_view_message_body(request.user, event.pk)  # PermissionDenied -> 403; audited
        context = {**self.admin_site.each_context(request), "opts": self.opts,
                   "title": f"Item #{event.pk}: message body", "event": event, "body": body,
                   "detail_url": reverse("admin:reconciliation_recoveryitem_change", args=[event.pk])}
        response = TemplateResponse(request, "admin/reconciliation/recoveryitem/body.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def attachment_view(self, request, pk, index):
        event = self.event_or_404(request, pk)
        try:
            attachment, payload = services.do_download_attachment(request.user, event.pk, index)
        except services.ActionRefused:
            raise Http404("no such attachment") from None
        response = HttpResponse(payload, content_type="application/octet-stream")
        response["Content-Disposition"] = services.attachment_content_disposition(attachment.filename,
                                                                                  index=int(index))
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "no-store"
        return response

