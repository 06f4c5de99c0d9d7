"""FakeAuthorizationServer: an OAuth 2.0 authorization server (authorization code + PKCE) on 127.0.0.1.

    server = FakeAuthorizationServer(client_id="app", client_secret="s3cret").start()
    server.url + "/authorize"      GET: checks the request (client, response_type, S256 challenge, redirect URI)
                                   and shows a consent page: "#approve" goes back with ?code=&state=, "#deny"
                                   with ?error=access_denied&state= (auto_approve=True: a 302 straight back)
    server.url + "/token"          POST grant_type=authorization_code: the code is single use, bound to its client
                                   and redirect URI, and base64url(SHA-256(code_verifier)) must equal the
                                   challenge the authorization request carried; otherwise 400 invalid_grant
    server.stop()

It echoes `state` untouched: checking it is the client's job. Every request is logged (`requests`), every
authorization request and token exchange too (`authorizations`, `exchanges`).
"""

import base64
import hashlib
import html
import secrets
from urllib.parse import parse_qs, urlencode

from tests.fake_google import FakeServer


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()


class FakeAuthorizationServer(FakeServer):
    def __init__(
        self,
        *,
        client_id="consent-app",
        client_secret="",
        scope_granted=None,
        refresh_lifetime=None,
        auto_approve=False,
        issue_refresh_token=True,
    ):
        super().__init__()
        self.client_id, self.client_secret = client_id, client_secret
        self.scope_granted = scope_granted  # None: what was asked for
        self.refresh_lifetime = refresh_lifetime  # seconds, sent as refresh_token_expires_in when set
        self.auto_approve = auto_approve
        self.issue_refresh_token = issue_refresh_token
        self.codes: dict[str, dict] = {}
        self.authorizations: list[dict] = []
        self.exchanges: list[dict] = []
        self.issued: list[dict] = []

    def route(self, method, path, query, headers, body):
        if method == "GET" and path == "/authorize":
            return self.authorize({k: v[-1] for k, v in query.items()})
        if method == "POST" and path == "/token":
            return self.token({k: v[-1] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()})
        if path == "/favicon.ico":  # the browser asks for one on the sign-in page
            return 204, {}, b""
        return 404, {}, {"error": "not_found"}

    def authorize(self, params: dict):
        self.authorizations.append(params)
        problem = (
            "unauthorized_client"
            if params.get("client_id") != self.client_id
            else "unsupported_response_type"
            if params.get("response_type") != "code"
            else "invalid_request"
            if params.get("code_challenge_method") != "S256"
            or len(params.get("code_challenge", "")) != 43
            or not params.get("redirect_uri")
            else ""
        )
        if problem:
            return 400, {"Content-Type": "text/plain"}, f"authorization request refused: {problem}"
        code = secrets.token_urlsafe(24)
        self.codes[code] = {
            "client_id": params["client_id"],
            "redirect_uri": params["redirect_uri"],
            "challenge": params["code_challenge"],
            "scope": params.get("scope", ""),
            "used": False,
        }
        back = params["redirect_uri"] + ("&" if "?" in params["redirect_uri"] else "?")
        approve = back + urlencode({"code": code, "state": params.get("state", "")})
        if self.auto_approve:
            return 302, {"Location": approve}, b""
        deny = back + urlencode(
            {"error": "access_denied", "error_description": "The user said no", "state": params.get("state", "")}
        )
        page = (
            f"<!doctype html><html><head><title>Sign in</title></head><body><h1>Fake sign-in</h1>"
            f"<p>Allow <b>{html.escape(params['client_id'])}</b> to use "
            f'<code id="scope">{html.escape(params.get("scope", ""))}</code>?</p>'
            f'<p><a id="approve" href="{html.escape(approve)}">Allow</a> '
            f'<a id="deny" href="{html.escape(deny)}">Deny</a></p></body></html>'
        )
        return 200, {"Content-Type": "text/html; charset=utf-8"}, page.encode()

    def token(self, form: dict):
        self.exchanges.append(form)
        refused = lambda error: (400, {}, {"error": error})  # noqa: E731
        if form.get("grant_type") != "authorization_code":
            return refused("unsupported_grant_type")
        if form.get("client_id") != self.client_id or form.get("client_secret", "") != self.client_secret:
            return refused("invalid_client")
        grant = self.codes.get(form.get("code", ""))
        if grant is None or grant["used"]:
            return refused("invalid_grant")
        grant["used"] = True  # single use, even when the rest is wrong (RFC 6749 §4.1.2)
        if form.get("redirect_uri") != grant["redirect_uri"] or grant["client_id"] != form["client_id"]:
            return refused("invalid_grant")
        if s256(form.get("code_verifier", "")) != grant["challenge"]:
            return refused("invalid_grant")
        tokens = {
            "token_type": "Bearer",
            "access_token": secrets.token_urlsafe(24),
            "expires_in": 3600,
            "scope": self.scope_granted if self.scope_granted is not None else grant["scope"],
        }
        if self.issue_refresh_token:
            tokens["refresh_token"] = "rt-" + secrets.token_urlsafe(24)
        if self.refresh_lifetime is not None:
            tokens["refresh_token_expires_in"] = self.refresh_lifetime
        self.issued.append(tokens)
        return 200, {"Cache-Control": "no-store"}, tokens
