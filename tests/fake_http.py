"""Free ports and fake HTTP servers, on the standard library only: a test module that launches its fake
as a server process imports this, not ``helpers`` (torch: 2 s a launch)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# --- processes and servers ----------------------------------------------------------------------


def free_port() -> int:
    """A free local TCP port (a child's torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class _HTTPServer(ThreadingHTTPServer):
    request_queue_size = 2048  # a client with 1,000 requests in flight (socketserver's default is 5)
    daemon_threads = True


class FakeServer:
    """Serves a handler class on a free local port, in a thread, as a context manager."""

    def _listen(self, handler):
        self.httpd = _HTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def serve_forever_at(self, host, port):
        """Launched mode (a server process): serve on ``host:port`` in this thread until killed."""
        handler = self.httpd.RequestHandlerClass
        self.httpd.server_close()
        self.httpd = _HTTPServer((host, int(port)), handler)
        self.httpd.serve_forever()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
