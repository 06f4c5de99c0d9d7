"""Errors as RFC 9457 problem details (`application/problem+json`: type, title, status, detail).

The console's exceptions map as in the admin: PermissionDenied 403, a missing (or other tenant's)
object 404, ActionRefused 409 (nothing written), a model's ValidationError 400.
"""

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from ..services import ActionRefused

PROBLEM_TYPE = "application/problem+json"
TYPE_BASE = "/api/problems/"


def _validation_detail(exc: DjangoValidationError):
    return exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}


def problem_exception_handler(exc, context):
    if isinstance(exc, ActionRefused):
        exc = exceptions.APIException(str(exc))
        exc.status_code, exc.default_code = status.HTTP_409_CONFLICT, "action_refused"
    elif isinstance(exc, ObjectDoesNotExist):
        exc = Http404("Not found.")
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(_validation_detail(exc))
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = exception_handler(exc, context)
    if response is None:
        return None  # a bug: Django's 500
    data = response.data
    code = getattr(exc, "default_code", "error") if isinstance(exc, exceptions.APIException) else "not_found"
    if isinstance(exc, exceptions.ValidationError):
        body = {"title": "Invalid request", "detail": _first_message(data), "errors": data}
        code = "invalid"
    else:
        detail = data.get("detail", "") if isinstance(data, dict) else str(data)
        body = {"title": response.status_text, "detail": str(detail)}
    problem = {"type": f"{TYPE_BASE}{code}", **body, "status": response.status_code}
    headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After", "Allow")}
    return Response(problem, status=response.status_code, headers=headers, content_type=PROBLEM_TYPE)


def _first_message(data) -> str:
    if isinstance(data, dict):
        for field, value in data.items():
            message = _first_message(value)
            if message:
                return message if field in ("non_field_errors", "detail") else f"{field}: {message}"
    elif isinstance(data, list):
        for value in data:
            message = _first_message(value)
            if message:
                return message
    return str(data) if data else ""
