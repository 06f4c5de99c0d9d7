"""GET /api/v1/: the API's index, the resource URLs under /api/v1/ and where the schema and its docs are.

Public by choice: it names only URLs, the same for every caller (the routes the README already documents),
never a row, a count or whether a tenant exists, so a newcomer's `curl` learns where to go and which header to
send. It keeps the API's authentication all the same: a bad or revoked token is the 401 (problem+json) every
other endpoint gives, so a client finds out at the door.
"""

from django.urls import reverse
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from .schema import ProblemAutoSchema

INDEX_RESPONSE = inline_serializer(
    "ApiIndex",
    fields={
        "name": serializers.CharField(),
        "version": serializers.CharField(),
        "authentication": serializers.CharField(),
        "resources": serializers.DictField(child=serializers.URLField()),
        "schema": serializers.URLField(),
        "docs": serializers.URLField(),
    },
)


class ApiIndex(APIView):
    """The resource URLs of the API (one per router registration), the OpenAPI schema and its docs page."""

    schema = ProblemAutoSchema()
    permission_classes = [AllowAny]  # authentication stays the API's (a bad token is a 401)
    renderer_classes = [JSONRenderer]  # JSON in a browser too: the index is for clients
    routes: list[tuple[str, str]] = []  # (prefix, basename) of the router's registry, given by urls.py

    @extend_schema(responses=INDEX_RESPONSE, summary="Index of the API")
    def get(self, request):
        url = lambda name: request.build_absolute_uri(reverse(name))  # noqa: E731
        return Response(
            {
                "name": "Mailroom API",
                "version": "1",
                "authentication": "Authorization: Token <token> (python manage.py api_token <username> prints one)",
                "resources": {prefix: url(f"api:{basename}-list") for prefix, basename in self.routes},
                "schema": url("api:schema"),
                "docs": url("api:docs"),
            }
        )
