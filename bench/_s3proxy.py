"""A counting HTTP proxy for an S3 server on this machine (bench/remote.py puts it in front of
moto): every request is forwarded as it came, and the GET requests and the bytes of their
bodies are counted, so a benchmark can say what each reader fetched. The counters are read at
``/__counts__`` (no bucket can have that name). The proxy runs in a process of its own, so it
takes no time from the reader being measured:

    python bench/_s3proxy.py http://127.0.0.1:PORT   # prints its own port, serves until killed
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

COUNTS_PATH = "/__counts__"

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "expect", "content-length"}  # fmt: skip


class _Counting(BaseHTTPRequestHandler):
    """Forwards each request upstream and counts it. A connection is kept alive or closed as
    upstream does: moto closes each one, and a proxy keeping them alive would change what
    the clients do (MosaicML Streaming's forked loader workers then share their parent's
    socket, which garbles shards and stalls downloads)."""

    protocol_version = "HTTP/1.1"
    upstream = ("127.0.0.1", 0)
    counts: ClassVar[dict[str, int]] = {"requests": 0, "gets": 0, "get_bytes": 0}
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _send(self, status: int, headers: list[tuple[str, str]], body: Iterable[bytes]) -> int:
        self.send_response_only(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        sent = 0
        for piece in body:
            self.wfile.write(piece)
            sent += len(piece)
        return sent

    def _forward(self) -> None:
        if self.path == COUNTS_PATH:
            with self.lock:
                doc = json.dumps(self.counts).encode()
            self._send(200, [("Content-Length", str(len(doc)))], [doc])
            return
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        for attempt in range(2):  # upstream may have closed a kept-alive connection
            conn = getattr(self, "_conn", None) or http.client.HTTPConnection(*self.upstream)
            self._conn = conn
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                break
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._conn = None
                if attempt:
                    raise
        out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
        if self.command == "HEAD":
            length, pieces = resp.getheader("Content-Length"), iter(())
            resp.read()
        elif resp.length is not None:  # streamed as it comes
            length = str(resp.length)
            pieces = iter(lambda: resp.read(1 << 20), b"")
        else:
            data = resp.read()
            length, pieces = str(len(data)), iter([data])
        if resp.will_close:
            out.append(("Connection", "close"))
            self.close_connection = True
        sent = self._send(resp.status, [*out, ("Content-Length", length or "0")], pieces)
        with self.lock:
            self.counts["requests"] += 1
            if self.command == "GET":
                self.counts["gets"] += 1
                self.counts["get_bytes"] += sent

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops the SYNs of a burst of new connections (every
    # request is one, as moto closes each), which the client resends only after 1 s
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # not a client hanging up
            super().handle_error(request, client_address)


def serve_proxy(upstream: str) -> None:
    """The proxy process: print its port, then serve until terminated."""
    host, port = upstream.removeprefix("http://").rsplit(":", 1)
    _Counting.upstream = (host, int(port))
    server = _Server(("127.0.0.1", 0), _Counting)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def start_proxy(upstream: str) -> tuple[subprocess.Popen[str], str]:
    """The proxy in front of ``upstream`` (``http://host:port``): its process and its URL."""
    cmd = [sys.executable, __file__, upstream]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def counts(endpoint: str) -> dict[str, int]:
    """The proxy's counters: requests, GETs and bytes of GET bodies sent, since it started."""
    with urllib.request.urlopen(endpoint + COUNTS_PATH, timeout=30) as r:
        return dict(json.load(r))


if __name__ == "__main__":
    serve_proxy(sys.argv[1])
