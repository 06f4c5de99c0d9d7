"""The OpenAPI schema's error responses: every operation declares the problem+json answers it can give.

drf-spectacular documents only the success; the API also answers 401 (no or a bad token), 403 (the role
lacks the permission), 404 (not found, another tenant's, or a stale cursor), 400 (a refused write or
filter) and, for queue actions, 409 (ActionRefused). See `errors.py`.
"""

from drf_spectacular.openapi import AutoSchema

from .errors import PROBLEM_TYPE
from .serializers import ProblemSerializer


class ProblemAutoSchema(AutoSchema):
    def error_statuses(self) -> list[str]:
        statuses = ["401", "403", "404"]
        if self.method in ("POST", "PUT", "PATCH") or (self.method == "GET" and self._is_list_view()):
            statuses.append("400")
        if self.method == "POST" and "/queue/" in self.path:
            statuses.append("409")
        return statuses

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction == "response":
            for status in self.error_statuses():
                responses.setdefault(
                    status,
                    self._get_response_for_code(
                        ProblemSerializer, status, media_types=[PROBLEM_TYPE], direction=direction
                    ),
                )
        return responses
