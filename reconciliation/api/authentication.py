"""`Authorization: Token <t>`: a token made in the console (API tokens) or by `manage.py api_token`, looked up by
its SHA-256; an expired or revoked one is refused (401)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .. import services

KEYWORD = "Token"


class ApiTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD.lower().encode():
            return None  # not ours: unauthenticated (a 401 from the permission check)
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: expected 'Token <token>'.")
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        found = services.user_for_token(token)
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid token.")  # unknown, revoked or expired alike
        return found

    def authenticate_header(self, request):
        return KEYWORD  # makes DRF answer 401 (with WWW-Authenticate), not 403


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "reconciliation.api.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>`; make one in the console (API tokens) or with "
            "`python manage.py api_token <username>`.",
        }
