"""StrictIMAP: a tiny IMAP server on 127.0.0.1 whose SASL XOAUTH2 / OAUTHBEARER follows the references to the
letter, for what Dovecot forgives: after a refused token it sends the error challenge (`+ <base64 JSON>`) and
REQUIRES the client's answer to be an empty line for XOAUTH2 (Google's XOAUTH2 protocol, "Error response") or
"AQ==" (%x01) for OAUTHBEARER (RFC 7628 §3.2.3). Anything else is `BAD` and the connection is closed; a
correct answer is `NO [AUTHENTICATIONFAILED]`, and with `close_after_refusal` the connection is closed too (a
server may do so, RFC 3501 leaves it open).

    imap = StrictIMAP(check=lambda user, token: token in good).start()
    imap.unavailable = True      # every AUTHENTICATE: NO [UNAVAILABLE] (Dovecot's answer when introspection fails)
    imap.sessions                # per connection: {"mechanism", "fields", "after_error", "outcome", "commands"}
    imap.stop()

After a login: CAPABILITY, NOOP, EXAMINE/SELECT (an empty folder), UID SEARCH (nothing), LOGOUT; anything else BAD.
"""

import base64
import json
import socketserver
import threading

GREETING = b"* OK [CAPABILITY IMAP4rev1 AUTH=XOAUTH2 AUTH=OAUTHBEARER] strict ready\r\n"
AFTER_ERROR = {"XOAUTH2": b"", "OAUTHBEARER": b"AQ=="}


class StrictIMAP:
    def __init__(self, check, close_after_refusal=True):
        self.check = check  # (user, token) -> bool
        self.close_after_refusal = close_after_refusal
        self.unavailable = False
        self.sessions: list[dict] = []
        self.lock = threading.Lock()
        self._server = None

    def start(self) -> "StrictIMAP":
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 10

            def handle(self):
                session = {"mechanism": None, "fields": {}, "after_error": None, "outcome": None, "commands": []}
                with owner.lock:
                    owner.sessions.append(session)
                owner._serve(self.rfile, self.wfile, session)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, rfile, wfile, session):
        wfile.write(GREETING)
        authenticated = False
        while line := rfile.readline():
            tag, _, rest = line.rstrip(b"\r\n").partition(b" ")
            command, _, argument = rest.partition(b" ")
            command = command.upper()
            session["commands"].append(command.decode())
            if command == b"LOGOUT":
                wfile.write(b"* BYE strict logging out\r\n" + tag + b" OK LOGOUT completed\r\n")
                return
            if command in (b"CAPABILITY", b"NOOP"):
                if command == b"CAPABILITY":
                    mechanisms = b"" if authenticated else b" AUTH=XOAUTH2 AUTH=OAUTHBEARER"
                    wfile.write(b"* CAPABILITY IMAP4rev1" + mechanisms + b"\r\n")
                wfile.write(tag + b" OK done\r\n")
            elif command == b"AUTHENTICATE" and not authenticated:
                outcome = self._authenticate(rfile, wfile, tag, argument.decode().upper(), session)
                session["outcome"] = outcome
                if outcome == "ok":
                    authenticated = True
                elif outcome == "bad" or (outcome == "refused" and self.close_after_refusal):
                    return
            elif command in (b"EXAMINE", b"SELECT") and authenticated:
                wfile.write(
                    b"* FLAGS (\\Seen)\r\n* 0 EXISTS\r\n* 0 RECENT\r\n* OK [UIDVALIDITY 7] ok\r\n"
                    b"* OK [UIDNEXT 1] ok\r\n" + tag + b" OK [READ-ONLY] done\r\n"
                )
            elif command == b"UID" and argument.upper().startswith(b"SEARCH") and authenticated:
                wfile.write(b"* SEARCH\r\n" + tag + b" OK done\r\n")
            else:
                wfile.write(tag + b" BAD not here\r\n")

    def _authenticate(self, rfile, wfile, tag, mechanism, session) -> str:
        if mechanism not in AFTER_ERROR:
            wfile.write(tag + b" NO [CANNOT] unsupported mechanism\r\n")
            return "no"
        session["mechanism"] = mechanism
        wfile.write(b"+ \r\n")
        user, token, fields = _parse(mechanism, base64.b64decode(rfile.readline().strip()))
        session["fields"] = fields
        if self.unavailable:
            wfile.write(tag + b" NO [UNAVAILABLE] Temporary authentication failure\r\n")
            return "unavailable"
        if user and token and self.check(user, token):
            wfile.write(tag + b" OK [CAPABILITY IMAP4rev1] Logged in\r\n")
            return "ok"
        error = json.dumps({"status": "401", "schemes": "Bearer", "scope": "https://mail.example.test/imap"})
        wfile.write(b"+ " + base64.b64encode(error.encode()) + b"\r\n")
        session["after_error"] = answer = rfile.readline().rstrip(b"\r\n")
        if answer != AFTER_ERROR[mechanism]:
            wanted = AFTER_ERROR[mechanism] or b"an empty line"
            wfile.write(tag + b" BAD the error challenge wants " + wanted + b"\r\n")
            return "bad"
        wfile.write(tag + b" NO [AUTHENTICATIONFAILED] Invalid credentials\r\n")
        return "refused"


def _parse(mechanism: str, response: bytes) -> tuple[str, str, dict]:
    """(user, token, key=value fields) of an initial response; empty strings when it is malformed."""
    text = response.decode("utf-8", "replace")
    if mechanism == "OAUTHBEARER":
        gs2, _, text = text.partition("\x01")
        if not (gs2.startswith("n,a=") and gs2.endswith(",")):
            return "", "", {}
        user = gs2[4:-1].replace("=2C", ",").replace("=3D", "=")
    else:
        user = ""
    if not text.endswith("\x01\x01"):
        return "", "", {}
    fields = dict(pair.partition("=")[::2] for pair in text[:-2].split("\x01"))
    token = fields.get("auth", "").removeprefix("Bearer ")
    return fields.get("user", user), token, fields
