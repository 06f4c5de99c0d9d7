"""Verify OIDC ID tokens (RS256 JWTs), such as the bearer token of a Pub/Sub push.

The signing keys come from a JWKS URL, cached per URL for `JWKS_TTL_SECONDS`
and fetched again (at most every `JWKS_REFETCH_SECONDS`) when a token names a
key id we do not know, which is how key rotation shows up. Only RS256 is
accepted: the algorithm is never taken from the token.

    claims = verify_id_token(token, jwks_url=..., audience=..., issuers=[...], email=None)

raises `TokenInvalid` with a short reason (never the token) when the signature,
issuer, audience, expiry or email check fails, or when the keys cannot be fetched.
"""

import logging
import threading
import time

import jwt
import requests

from intake.egress import EgressRefused, guarded_session

log = logging.getLogger(__name__)

JWKS_TTL_SECONDS = 3600
JWKS_REFETCH_SECONDS = 30
JWKS_TIMEOUT = (3.05, 5.0)
LEEWAY_SECONDS = 60
ALGORITHMS = ["RS256"]

_jwks: dict[str, tuple[dict, float]] = {}  # url -> ({kid: PyJWK}, fetched_at)
_jwks_lock = threading.Lock()


class TokenInvalid(Exception):
    """The token is not one we accept; `str(exc)` is a short reason safe to log."""


def clear_jwks_cache() -> None:
    with _jwks_lock:
        _jwks.clear()


def _fetch_keys(url: str) -> dict:
    try:
        # A mailbox may name its JWKS URL: through the egress guard (intake.egress).
        with guarded_session(purpose="jwks_url") as session:
            response = session.get(url, timeout=JWKS_TIMEOUT, allow_redirects=False)
    except EgressRefused as exc:
        raise TokenInvalid(f"signing keys unavailable ({exc})") from None
    except requests.RequestException as exc:
        raise TokenInvalid(f"signing keys unavailable ({type(exc).__name__})") from None
    if response.status_code != 200:
        raise TokenInvalid(f"signing keys unavailable (HTTP {response.status_code})")
    try:
        keyset = jwt.PyJWKSet.from_dict(response.json())
    except (ValueError, jwt.PyJWKSetError, jwt.InvalidKeyError) as exc:
        raise TokenInvalid(f"signing keys unreadable ({type(exc).__name__})") from None
    return {key.key_id: key for key in keyset.keys if key.key_id}


def _signing_key(url: str, kid: str):
    now = time.monotonic()
    with _jwks_lock:
        keys, fetched_at = _jwks.get(url, ({}, -1e9))
    fresh = now - fetched_at < JWKS_TTL_SECONDS
    if kid in keys and fresh:
        return keys[kid]
    if fresh and now - fetched_at < JWKS_REFETCH_SECONDS:
        raise TokenInvalid("unknown signing key")  # just fetched: do not let tokens make us hammer the URL
    try:
        keys = _fetch_keys(url)
    except TokenInvalid:
        with _jwks_lock:
            stale = _jwks.get(url)
        if stale and kid in stale[0]:
            log.warning("oidc: keeping cached signing keys; the JWKS URL did not answer")
            return stale[0][kid]
        raise
    with _jwks_lock:
        _jwks[url] = (keys, now)
    if kid not in keys:
        raise TokenInvalid("unknown signing key")
    return keys[kid]


def verify_id_token(
    token: str, *, jwks_url: str, audience: str, issuers, email: str = "", leeway: int = LEEWAY_SECONDS
) -> dict:
    """The verified claims of `token`, or TokenInvalid."""
    if not token:
        raise TokenInvalid("no bearer token")
    if not audience:
        raise TokenInvalid("no audience configured")  # fail closed: any Google token would pass otherwise
    if not jwks_url:
        raise TokenInvalid("no JWKS URL configured")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError:
        raise TokenInvalid("malformed token") from None
    if header.get("alg") not in ALGORITHMS:
        raise TokenInvalid("unexpected algorithm")
    key = _signing_key(jwks_url, str(header.get("kid") or ""))
    try:
        claims = jwt.decode(
            token,
            key=key.key,
            algorithms=ALGORITHMS,
            audience=audience,
            leeway=leeway,
            options={"require": ["exp", "iat", "iss", "aud"]},
        )
    except jwt.ExpiredSignatureError:
        raise TokenInvalid("token expired") from None
    except jwt.InvalidAudienceError:
        raise TokenInvalid("wrong audience") from None
    except jwt.InvalidSignatureError:
        raise TokenInvalid("bad signature") from None
    except jwt.InvalidTokenError as exc:
        raise TokenInvalid(f"invalid token ({type(exc).__name__})") from None
    if claims.get("iss") not in set(issuers):
        raise TokenInvalid("wrong issuer")
    if email:
        if str(claims.get("email", "")).lower() != email.lower() or claims.get("email_verified") not in (True, "true"):
            raise TokenInvalid("wrong service account")
    return claims
