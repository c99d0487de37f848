"""The metrics endpoint is served off the trio thread (issue 50, H3, H4): slow clients
hold threads, not the loop's slots, and a flood of scrapes renders on the trio thread
at most once per interval."""

from __future__ import annotations

import socket
import threading

import trio

from mlfs import http as mlfs_http

GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def _scrape(port: int) -> bytes:
    """One scrape from a plain thread (blocking sockets, as Prometheus would)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(GET)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data


def test_sixteen_slow_connections_do_not_stop_a_concurrent_scrape():
    async def main() -> list[bytes]:
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(mlfs_http.serve_metrics, lambda: "mlfs_up 1\n",
                                          "127.0.0.1", 0)
            slow = []
            for _ in range(16):  # a slowloris: each has sent part of a request head
                conn = socket.create_connection(("127.0.0.1", port))
                conn.sendall(b"GET /metrics HTTP/1.1\r\n")
                slow.append(conn)
            try:
                return [await trio.to_thread.run_sync(_scrape, port) for _ in range(3)]
            finally:
                for conn in slow:
                    conn.close()
                nursery.cancel_scope.cancel()

    for answer in trio.run(main):
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:80]
        assert answer.endswith(b"\r\n\r\nmlfs_up 1\n")


def test_a_scrape_flood_renders_once_per_interval_and_only_on_the_trio_thread(monkeypatch):
    # an hour: every scrape below falls within one interval of the first
    monkeypatch.setattr(mlfs_http, "RENDER_SECONDS", 3600.0, raising=False)
    threads = []

    def render() -> str:
        threads.append(threading.get_ident())
        return "mlfs_up 1\n"

    async def main() -> tuple[int, list[bytes]]:
        trio_thread = threading.get_ident()
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(mlfs_http.serve_metrics, render, "127.0.0.1", 0)
            answers: list[bytes] = []

            async def scraper():
                for _ in range(5):
                    answers.append(await trio.to_thread.run_sync(_scrape, port))

            async with trio.open_nursery() as flood:
                for _ in range(8):
                    flood.start_soon(scraper)
            nursery.cancel_scope.cancel()
        return trio_thread, answers

    trio_thread, answers = trio.run(main)
    assert len(answers) == 40 and all(a.startswith(b"HTTP/1.1 200 OK") for a in answers)
    assert threads == [trio_thread]  # one rendering, on the trio thread, shared by 40
