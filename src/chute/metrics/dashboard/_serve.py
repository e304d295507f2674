"""Run the dashboard app under uvicorn on a socket we bind, so port 0 still prints a URL."""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import webbrowser

import uvicorn

from ._app import create_app


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def url_of(sock: socket.socket) -> str:
    """The http URL a bound socket serves."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(
    paths: list[str], *, host: str = "127.0.0.1", port: int = 0, open_browser: bool = False
) -> None:
    """Serve the dashboard over `paths` until interrupted, printing its URL first.

    Binds loopback unless `host` says otherwise; port 0 lets the OS pick a free port.

    Skipped as a doctest: it serves until interrupted (`create_app` is the app it serves;
    ``tests/metrics`` start it on a free port).

    >>> from chute.metrics.dashboard import serve
    >>> serve(["/runs"], port=8050)  # doctest: +SKIP
    chute metrics dashboard at http://127.0.0.1:8050/
    """
    loopback = _is_loopback(host)
    names = ["127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host]
    app = create_app(paths, allowed_hosts=names if loopback else None)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # before the URL is printed: early clients queue instead of bouncing
    except OSError:
        sock.close()
        raise
    url = url_of(sock)
    if not loopback:
        print(
            f"warning: serving on {host}: anyone who can reach it can read these runs",
            file=sys.stderr,
        )
    print(f"chute metrics dashboard at {url}", flush=True)
    if open_browser:
        threading.Timer(0.5, webbrowser.open, args=(url,)).start()
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
