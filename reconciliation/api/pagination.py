"""Cursor pages: stable under inserts, no counts (the inbox is big)."""

from rest_framework.pagination import CursorPagination


class ApiCursorPagination(CursorPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200
    ordering = "-pk"


class OldestFirst(ApiCursorPagination):
    ordering = ("received_at", "pk")


class NewestFirst(ApiCursorPagination):
    ordering = ("-received_at", "-pk")


class LatestRunsFirst(ApiCursorPagination):
    ordering = ("-started_at", "-pk")
