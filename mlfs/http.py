"""`GET /metrics` over HTTP, served from a thread of its own, rendered on the trio thread.

The `metrics` file of the mount is Prometheus text exposition already; this
serves the very same text at `http://<metrics_address>:<metrics_port>/metrics`
so a Prometheus server can scrape the daemon without reading the mount.

Connections are accepted and served by plain threads, never by the trio loop:
a client that trickles its request a byte at a time (a slowloris) holds one
thread until its deadline, not a slot the mount's loop waits on.  Each
connection has `HEAD_SECONDS` to send its whole request head (a deadline for the
head, not a timeout per read, which a byte every 0.5 s would never trip) and
`SEND_SECONDS` to take the answer; at most `MAX_CONNECTIONS` are served at once,
the rest get a 503 at once.  Measured before this (issue 50, H3): 16 slow
connections made 35 of 36 scrapes fail with the 16-slot limiter on the loop.

`render()` reads state that only the trio thread mutates (tick loops, proxies),
so it still runs there, between two awaits (`trio.from_thread.run_sync`), the
only consistent snapshot there is.  But at most once per `RENDER_SECONDS`:
concurrent and closely following scrapes share the last rendering, so a flood
of scrapes costs the loop two renders a second, not one per request (H4: 2,157
renders in 10 s had slowed `cat MOUNT/version` from 5 to 53 ms).  A failed
rendering is not kept.

The protocol is deliberately tiny: one request per connection (HTTP/1.1 with
`Connection: close`), GET and HEAD of `/metrics` and of `/` (a landing page
linking it), 404 for any other path.  Loopback only by default (`[mount]
metrics_address`); off unless `[mount] metrics_port` is set.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

import trio

log = logging.getLogger("mlfs.http")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_BYTES = 8192
#: a client has this long to send its whole request head (a deadline, not per read)
HEAD_SECONDS = 5.0
#: and this long to take the answer
SEND_SECONDS = 10.0
#: connections served at once (a thread each); the next gets a 503 at once
MAX_CONNECTIONS = 64
#: scrapes within this long of a rendering share it (the trio thread renders)
RENDER_SECONDS = 0.5

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Content Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


def response(status: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8",
             head: bool = False, extra: dict[str, str] | None = None) -> bytes:
    """One whole HTTP/1.1 response; HEAD gets the headers of the body it does not get."""
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)),
               "Connection": "close", "Cache-Control": "no-store", **(extra or {})}
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (b"" if head else body)


LANDING = (b"<!doctype html>\n<html><head><title>mlfs</title></head><body>\n"
           b"<h1>mlfs</h1><p><a href=\"/metrics\">Metrics</a></p>\n</body></html>\n")


def answer(request: bytes, render: Callable[[], str]) -> bytes:
    """The response to one request head (everything before the blank line)."""
    try:
        request_line = request.split(b"\n", 1)[0].rstrip(b"\r").decode("ascii")
        method, target, version = request_line.split(" ")
    except (UnicodeDecodeError, ValueError):
        return response(400, b"malformed request line\n")
    if not version.startswith("HTTP/1."):
        return response(400, b"HTTP/1.x only\n")
    path = target.split("?", 1)[0]
    if path == "/" and method in ("GET", "HEAD"):  # a landing page, as node_exporter has
        return response(200, LANDING, "text/html; charset=utf-8", head=method == "HEAD")
    if path != "/metrics":
        return response(404, b"not found; the metrics are at /metrics\n")
    if method not in ("GET", "HEAD"):
        return response(405, b"GET or HEAD only\n", extra={"Allow": "GET, HEAD"})
    try:
        body = render().encode("utf-8")
    except Exception:  # a bug in rendering must not take the server (or the mount) down
        log.exception("rendering /metrics failed")
        return response(500, b"rendering the metrics failed; see the daemon log\n")
    return response(200, body, CONTENT_TYPE, head=method == "HEAD")


class MetricsServer:
    """Answers scrapes from threads with `render()` run on the trio thread (at most once
    per `min_interval` seconds of `clock`); one instance per daemon."""

    def __init__(self, render: Callable[[], str], token: trio.lowlevel.TrioToken,
                 min_interval: float = RENDER_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.render = render
        self.token = token
        self.min_interval = min_interval
        self.clock = clock
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        #: one rendering at a time; scrapes arriving meanwhile wait and share it
        self._render_lock = threading.Lock()
        self._text: str | None = None
        self._rendered_at = 0.0
        self.requests = 0
        self.renders = 0

    def text(self) -> str:
        """The exposition text: the last rendering when it is recent enough, else a new
        one made on the trio thread (this thread waits for it)."""
        with self._render_lock:
            now = self.clock()
            if self._text is None or now - self._rendered_at >= self.min_interval:
                self._text = None
                text = trio.from_thread.run_sync(self.render, trio_token=self.token)
                self.renders += 1
                self._text, self._rendered_at = text, now
            return self._text

    def serve(self, listener: socket.socket) -> None:
        """Accept until `listener` is shut down; each connection in a thread of its own."""
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # shut down (close() below), or the socket is gone
            if not self.slots.acquire(blocking=False):
                _reply(conn, response(503, b"too many connections\n",
                                      extra={"Retry-After": "1"}))
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="mlfs-metrics-conn").start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn, time.monotonic() + HEAD_SECONDS)
            if request is None:
                return
            self.requests += 1
            if request == b"":
                _reply(conn, response(413, b"request head too long\n"))
            else:
                _reply(conn, answer(request, self.text))
        finally:
            self.slots.release()

    @staticmethod
    def close(listener: socket.socket) -> None:
        """Stop accepting: `accept()` in `serve` returns at once (no polling)."""
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()


def _reply(conn: socket.socket, data: bytes) -> None:
    """Send `data` within SEND_SECONDS and close; a client that went away is no error."""
    try:
        conn.settimeout(SEND_SECONDS)
        conn.sendall(data)
    except OSError:
        pass
    finally:
        conn.close()


def _read_request(conn: socket.socket, deadline: float) -> bytes | None:
    """The request head; b"" when it is too long; None (connection closed) when the
    client went away or did not finish it before `deadline`."""
    data = b""
    try:
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            conn.settimeout(left)
            chunk = conn.recv(4096)
            if not chunk:
                if data:
                    return data  # a client that half-closes after its request is fine
                raise ConnectionResetError
            data += chunk
            if len(data) > MAX_REQUEST_BYTES:
                return b""
    except OSError:  # TimeoutError included: a slow client is dropped, not answered
        conn.close()
        return None
    return data


def _listen(address: str, port: int) -> socket.socket:
    family, kind, proto, _, where = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listener.bind(where)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


async def serve_metrics(render: Callable[[], str], address: str, port: int,
                        task_status=trio.TASK_STATUS_IGNORED, *,
                        min_interval: float | None = None) -> None:
    """Serve until cancelled.  A failure to listen is logged, never fatal to the mount.

    `task_status.started()` is given the listening (host, port), or None when
    it could not listen (the `metrics` file of the mount still works).
    `min_interval`: RENDER_SECONDS unless given.
    """
    try:
        listener = _listen(address, port)
    except OSError as exc:
        log.error("metrics over HTTP disabled: cannot listen on %s port %d: %s",
                  address, port, exc.strerror or exc)
        task_status.started(None)
        return
    server = MetricsServer(render, trio.lowlevel.current_trio_token(),
                           RENDER_SECONDS if min_interval is None else min_interval)
    threading.Thread(target=server.serve, args=(listener,), daemon=True,
                     name="mlfs-metrics-http").start()
    bound = listener.getsockname()[:2]
    log.info("serving Prometheus metrics at http://%s/metrics",
             f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}")
    task_status.started(bound)
    try:
        await trio.sleep_forever()
    finally:
        server.close(listener)
