"""Resolve secret references (`env:NAME`, `file:/path`). The database only ever holds the reference."""
import os
from pathlib import Path


class SecretUnavailable(Exception):
    """The reference is malformed, or points at nothing."""


def resolve_secret(ref: str) -> str:
    if not ref:
        raise SecretUnavailable("no secret reference configured")
    scheme, _, target = ref.partition(":")
    if scheme == "env":
        value = os.environ.get(target)
        if value is None:
            raise SecretUnavailable(f"environment variable {target} is not set")
        return value
    if scheme == "file":
        try:
            return Path(target).read_text().strip()
        except OSError as exc:
            raise SecretUnavailable(f"secret file unreadable: {exc.strerror}") from None
    raise SecretUnavailable("a secret reference starts with env: or file:")
