"""HTTP plumbing shared by the tests' fake SGLang servers (test_specbench, test_lossless)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler that answers JSON."""

    def log_message(self, *args):
        pass

    def _send(self, code, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _payload(self):
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))


class FakeServer:
    """Serves a handler class on a free local port, in a thread, as a context manager."""

    def _listen(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def serve_forever_at(self, host, port):
        """Launched mode (a server process): serve on ``host:port`` in this thread until killed."""
        handler = self.httpd.RequestHandlerClass
        self.httpd.server_close()
        self.httpd = ThreadingHTTPServer((host, int(port)), handler)
        self.httpd.serve_forever()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
