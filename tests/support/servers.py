"""Real servers on 127.0.0.1 for tests that must see whether anything connected."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CountingServer:
    """A real HTTP server on 127.0.0.1 that counts every connection it accepts (and answers 200 {})."""

    def __init__(self):
        self.connections = 0
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._answer()

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def _answer(self):
                body = b'{"ok": true, "access_token": "t", "user": {"id": 1}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            def verify_request(self, request, client_address):
                counter.connections += 1
                return True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
