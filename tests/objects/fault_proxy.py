"""A small threaded HTTP proxy in front of the moto S3 server that injects faults: 503s, a
connection dropped before the answer or cut inside it, an answer held back; and counts the
requests it saw and how many were in flight at once. And a static web server with ranges
(`FileServer`), for datasets read over http://."""

from __future__ import annotations

import http.client
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlparse

Fault = Callable[[str, str], str | None]
"""``fault(method, path)``: None to pass the request on, or ``"503"``, ``"403"``,
``"drop"`` (close without answering), ``"cut"`` (answer, then close halfway through the
body), ``"hold"`` (wait until ``hold_for`` requests are in flight, or a second, then pass)."""

_SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"
_DENIED = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client killed mid-request (a writer under test): its connection breaks


class FaultProxy:
    """Forwards every request to ``upstream`` unless ``fault`` says otherwise."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.fault: Fault = lambda method, path: None
        self.hold_for = 1
        self.seen: list[tuple[str, str]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._cond = threading.Condition()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def handle_one(self) -> None:
                proxy._handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_one

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self, method: str, contains: str = "") -> int:
        """Requests seen of ``method`` whose path contains ``contains``."""
        return sum(1 for m, p in self.seen if m == method and contains in p)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        with self._cond:
            self.seen.append((req.command, req.path))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._cond.notify_all()
        try:
            action = self.fault(req.command, req.path)
            if action == "hold":
                with self._cond:
                    self._cond.wait_for(lambda: self.in_flight >= self.hold_for, timeout=1.0)
                action = None
            if action in ("503", "403"):
                payload = _SLOW_DOWN if action == "503" else _DENIED
                req.send_response(int(action))
                req.send_header("Content-Type", "application/xml")
                req.send_header("Content-Length", str(len(payload)))
                req.end_headers()
                if req.command != "HEAD":  # an answer to HEAD has no body, even an error's
                    req.wfile.write(payload)
                return
            if action == "drop":
                req.close_connection = True
                req.connection.shutdown(socket.SHUT_RDWR)
                return
            self._forward(req, body, cut=action == "cut")
        finally:
            with self._cond:
                self.in_flight -= 1

    def _forward(self, req: BaseHTTPRequestHandler, body: bytes, *, cut: bool) -> None:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() != "connection"}
            conn.request(req.command, req.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        req.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                req.send_header(key, value)
        size = int(answer.getheader("Content-Length") or len(data))
        req.send_header("Content-Length", str(size))
        req.end_headers()
        if req.command == "HEAD":
            return
        if cut and len(data) > 1:
            req.wfile.write(data[: len(data) // 2])
            req.wfile.flush()
            time.sleep(0.05)
            req.close_connection = True
            req.connection.shutdown(socket.SHUT_RDWR)
            return
        req.wfile.write(data)


class FileServer:
    """A static web server over a folder that answers HEAD and GET with ``Range`` and an
    ``ETag`` (size and mtime), as a web server hosting a dataset does (Python's own
    http.server ignores ranges)."""

    def __init__(self, root: str) -> None:
        folder = os.path.abspath(root)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def do_GET(self) -> None:
                self.answer(body=True)

            def answer(self, *, body: bool) -> None:
                path = os.path.join(folder, self.path.lstrip("/"))
                if not os.path.abspath(path).startswith(folder) or not os.path.isfile(path):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                st = os.stat(path)
                etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
                with open(path, "rb") as f:
                    data = f.read()
                start, end, status = 0, len(data), 200
                ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if ranged:
                    start = int(ranged[1])
                    end = min(len(data), int(ranged[2]) + 1) if ranged[2] else len(data)
                    status = 206
                self.send_response(status)
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
                self.send_header("Content-Length", str(end - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.end_headers()
                if body:
                    self.wfile.write(data[start:end])

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
