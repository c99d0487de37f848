"""A real S3 endpoint on this machine for the store tests: moto's server in a subprocess.

The process is started on a free port, polled until it answers, and stopped by its pid
(terminate, then kill) when the fixture ends.  The endpoint reaches s3fs through
botocore's own `AWS_ENDPOINT_URL` setting, in this process and in any `mlfs` command a
test starts, so the code under test carries no test switch.  A test takes it with the
`s3_endpoint` fixture (tests/conftest.py registers this module): one server per module.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: what botocore needs to talk to moto (any key is accepted there)
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """A moto S3 server's endpoint URL, for the life of the block."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **S3_ENV})
    try:
        deadline = time.monotonic() + 120  # a slow import on a busy machine, not a bound
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).close()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start: "
                                       f"{log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        if process.poll() is not None:  # it died under the tests: say how, for the failure
            print(f"moto server (pid {process.pid}) ended early with {process.returncode}:\n"
                  f"{log.read_text()[-3000:]}", file=sys.stderr)
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def s3_environment(endpoint: str) -> dict[str, str]:
    """The environment variables that point botocore (and so s3fs) at `endpoint`."""
    return {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}


def new_bucket(name: str) -> str:
    """Create bucket `name` in the endpoint the environment names; its s3:// URL."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory) -> Iterator[str]:
    """A moto server for the module, named in this process's environment (the `mlfs`
    commands and Dask processes a test starts inherit it) until the module ends."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with moto_server(log) as endpoint:
        saved = {k: os.environ.get(k) for k in s3_environment(endpoint)}
        os.environ.update(s3_environment(endpoint))
        try:
            yield endpoint
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
