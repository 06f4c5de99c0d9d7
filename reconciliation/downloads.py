"""The HTTP answer that hands an operator one stored attachment, for the console and the API alike.

Always `application/octet-stream` with `nosniff` (a browser never renders what a sender sent) and `no-store`
(a shared cache never keeps it); the file name as `services.attachment_content_disposition` writes it.
"""

from django.http import HttpResponse

from . import services


def attachment_response(filename: str, payload: bytes, *, index: int) -> HttpResponse:
    response = HttpResponse(payload, content_type="application/octet-stream")
    response["Content-Disposition"] = services.attachment_content_disposition(filename, index=index)
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response
