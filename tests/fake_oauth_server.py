"""FakeOAuth: an OAuth 2.0 authorization server on 127.0.0.1 that issues, rotates, introspects and revokes tokens,
for Dovecot's `passdb { driver = oauth2 }` (introspection_mode = post) and Mailroom's token sources.

    oauth = FakeOAuth(token_lifetime=600).start()
    refresh = oauth.grant("user@example.test")       # a refresh token, as an admin's consent would leave
    oauth.expire_access_tokens()                     # every issued access token is now refused by introspection
    oauth.revoke("user@example.test")                # access and refresh tokens of the user: void
    oauth.stop()

Endpoints:
    POST /token        grant_type=refresh_token: the refresh token must be the user's current one; the answer
                       carries a NEW refresh token and the old one is void from then on (invalid_grant, and
                       recorded in `reused_refresh_tokens`: a client that sends a rotated token is wrong);
                       grant_type=client_credentials with `client_users[client_id]`: a token for that user;
                       grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer (a Google service account with
                       domain-wide delegation): an RS256 assertion signed by a key of `service_accounts`
                       (iss -> public key), aud Google's token endpoint (what google-auth signs for, wherever
                       it posts): a token for its `sub`
    POST /introspect   token=<access token> -> {"active": true, "username": ..., "scope": ...} or {"active": false}
    GET  /<tenant>/v2.0/.well-known/openid-configuration   what msal reads of an Entra ID authority
                       (`start(ssl_context)`: msal speaks only https)

The client's id and secret are checked on every token request. Access tokens live `token_lifetime` seconds.
"""

import secrets
import time
from urllib.parse import parse_qs

import jwt

from tests.fake_google import FakeServer

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


class FakeOAuth(FakeServer):
    def __init__(
        self,
        *,
        client_id="imap-client",
        client_secret="imap-secret",
        token_lifetime=3600,
        scope="https://mail.example.test/imap",
    ):
        super().__init__()
        self.client_id, self.client_secret = client_id, client_secret
        self.token_lifetime = token_lifetime
        self.scope = scope
        self.access_tokens: dict[str, dict] = {}  # token -> {"user", "expires"}
        self.refresh_tokens: dict[str, str] = {}  # current refresh token -> user
        self.void_refresh_tokens: set[str] = set()  # rotated away (revoked ones are simply gone)
        self.reused_refresh_tokens: list[str] = []  # rotated-away tokens a client sent again
        self.client_users: dict[str, str] = {}  # client_credentials: client id -> the user its token is for
        self.service_accounts: dict[str, object] = {}  # jwt-bearer: service account email -> RSA public key
        self.issued: list[dict] = []  # {"grant", "user", "refresh_sent", "refresh_issued"}
        self.introspections = 0

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    @property
    def introspection_url(self) -> str:
        return f"{self.url}/introspect"

    # --- test helpers ---------------------------------------------------------------------------

    def grant(self, user: str) -> str:
        token = "rt-" + secrets.token_urlsafe(18)
        with self.lock:
            self.refresh_tokens[token] = user
        return token

    def current_refresh_token(self, user: str) -> str | None:
        with self.lock:
            return next((t for t, u in self.refresh_tokens.items() if u == user), None)

    def expire_access_tokens(self):
        with self.lock:
            for token in self.access_tokens.values():
                token["expires"] = 0

    def revoke(self, user: str):
        with self.lock:
            self.access_tokens = {t: v for t, v in self.access_tokens.items() if v["user"] != user}
            for token in [t for t, u in self.refresh_tokens.items() if u == user]:
                del self.refresh_tokens[token]

    # --- routing --------------------------------------------------------------------------------

    def route(self, method, path, query, headers, body):
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if method == "POST" and path == "/token":
            return self._token(form)
        if method == "POST" and path == "/introspect":
            return self._introspect(form)
        if method == "GET" and path.endswith("/v2.0/.well-known/openid-configuration"):
            tenant = path.split("/")[1]
            return (
                200,
                {},
                {
                    "issuer": f"{self.url}/{tenant}/v2.0",
                    "token_endpoint": self.token_url,
                    "authorization_endpoint": f"{self.url}/{tenant}/oauth2/v2.0/authorize",
                },
            )
        return 404, {}, {"error": "not_found"}

    def _token(self, form: dict):
        if form.get("grant_type") == JWT_BEARER:
            return self._jwt_bearer(form.get("assertion", ""))
        with self.lock:
            if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
                return 401, {}, {"error": "invalid_client"}
            grant = form.get("grant_type")
            new_refresh = None
            if grant == "refresh_token":
                sent = form.get("refresh_token", "")
                user = self.refresh_tokens.pop(sent, None)
                if user is None:
                    if sent in self.void_refresh_tokens:
                        self.reused_refresh_tokens.append(sent)
                    return 400, {}, {"error": "invalid_grant", "error_description": "refresh token is void"}
                self.void_refresh_tokens.add(sent)
                new_refresh = "rt-" + secrets.token_urlsafe(18)
                self.refresh_tokens[new_refresh] = user
            elif grant == "client_credentials" and form.get("client_id") in self.client_users:
                sent, user = None, self.client_users[form["client_id"]]
            else:
                return 400, {}, {"error": "unsupported_grant_type"}
            access = "at-" + secrets.token_urlsafe(24)
            self.access_tokens[access] = {"user": user, "expires": time.time() + self.token_lifetime}
            self.issued.append({"grant": grant, "user": user, "refresh_sent": sent, "refresh_issued": new_refresh})
        return self._answer(access, new_refresh)

    def _answer(self, access: str, new_refresh: str | None = None):
        answer = {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.token_lifetime,
            "scope": self.scope,
        }
        if new_refresh:
            answer["refresh_token"] = new_refresh
        return 200, {"Cache-Control": "no-store"}, answer

    def _jwt_bearer(self, assertion: str):
        try:
            issuer = jwt.decode(assertion, options={"verify_signature": False}).get("iss")
            key = self.service_accounts[issuer]
            claims = jwt.decode(assertion, key, algorithms=["RS256"], audience=GOOGLE_TOKEN_AUDIENCE)
        except (KeyError, jwt.PyJWTError):
            return 400, {}, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        if not claims.get("sub") or "scope" not in claims:
            return 400, {}, {"error": "unauthorized_client"}
        access = "at-" + secrets.token_urlsafe(24)
        with self.lock:
            self.access_tokens[access] = {"user": claims["sub"], "expires": time.time() + self.token_lifetime}
            self.issued.append(
                {
                    "grant": JWT_BEARER,
                    "user": claims["sub"],
                    "refresh_sent": None,
                    "refresh_issued": None,
                    "scope": claims["scope"],
                    "iss": issuer,
                }
            )
        return self._answer(access)

    def _introspect(self, form: dict):
        with self.lock:
            self.introspections += 1
            entry = self.access_tokens.get(form.get("token", ""))
            if entry is None or entry["expires"] <= time.time():
                return 200, {}, {"active": False}
        return 200, {}, {"active": True, "username": entry["user"], "scope": self.scope, "exp": int(entry["expires"])}
