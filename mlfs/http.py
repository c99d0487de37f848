"""`GET /metrics` over HTTP, served from the daemon's trio loop.

The `metrics` file of the mount is Prometheus text exposition already; this
serves the very same text at `http://<metrics_address>:<metrics_port>/metrics`
so a Prometheus server can scrape the daemon without reading the mount.

It runs as a task in the daemon's nursery, never in a thread: `render()` reads
state that only the trio thread mutates (tick loops, proxies), so rendering
between two awaits of that thread is the only consistent snapshot there is.
The server is deliberately tiny: one request per connection (HTTP/1.1 with
`Connection: close`), GET and HEAD of `/metrics` and of `/` (a landing page linking
it), 404 for any other path, a
time limit per connection and a cap on concurrent connections so a slow or
hostile client can never hold the mount's loop.  Loopback only by default
(`[mount] metrics_address`); off unless `[mount] metrics_port` is set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

log = logging.getLogger("mlfs.http")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_BYTES = 8192
#: a client has this long to send its request and take the answer
CONNECTION_SECONDS = 10.0
MAX_CONNECTIONS = 16

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


async def _read_request(stream: trio.SocketStream) -> bytes | None:
    """The request head, or None when it is too long or the client went away."""
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return data or None  # a client that half-closes after its request is fine
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            return b""
    return data


class MetricsServer:
    """Answers scrapes with `render()`; one instance per daemon."""

    def __init__(self, render: Callable[[], str]) -> None:
        self.render = render
        self.limiter = trio.CapacityLimiter(MAX_CONNECTIONS)
        self.requests = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            if self.limiter.available_tokens == 0:
                await stream.send_all(response(503, b"too many connections\n",
                                               extra={"Retry-After": "1"}))
                return
            async with self.limiter:
                with trio.move_on_after(CONNECTION_SECONDS):
                    request = await _read_request(stream)
                    if request is None:
                        return
                    self.requests += 1
                    if request == b"":
                        await stream.send_all(response(413, b"request head too long\n"))
                    else:
                        await stream.send_all(answer(request, self.render))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away: nothing to tell it
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()


async def serve_metrics(render: Callable[[], str], address: str, port: int,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled.  A failure to listen is logged, never fatal to the mount.

    `task_status.started()` is given the listening (host, port), or None when
    it could not listen (the `metrics` file of the mount still works).
    """
    server = MetricsServer(render)
    try:
        listeners = await trio.open_tcp_listeners(port, host=address)
    except OSError as exc:
        log.error("metrics over HTTP disabled: cannot listen on %s port %d: %s",
                  address, port, exc.strerror or exc)
        task_status.started(None)
        return
    bound = listeners[0].socket.getsockname()[:2]
    log.info("serving Prometheus metrics at http://%s/metrics",
             f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}")
    task_status.started(bound)
    await trio.serve_listeners(server.handle, listeners)
