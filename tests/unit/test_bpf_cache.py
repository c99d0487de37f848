"""The BPF loader cache (backends/linux/bio.py `build`): root runs what it finds there, so
the cache is made 0755 whatever the umask and a loader is run only when it, and every
directory above it, is root's alone and its bytes hash to what was recorded at build
time (red-team B2: under umask 0 every directory was 0777, nobody replaced `blkreq`, and
the next `build()` returned it unchecked)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlfs.backends.linux import bio

from mlfs.abi import SettingError
from tests.harness import REPO

pytestmark = pytest.mark.skipif(bio.unavailable() is not None,
                                reason=f"the BPF tools: {bio.unavailable()}")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The loader built for real by a process running under umask 0."""
    cache = tmp_path_factory.mktemp("bpfc") / "mlfs" / "bpf"
    done = subprocess.run(
        ["sh", "-c", 'umask 0; exec "$0" -c "$1"', sys.executable, textwrap.dedent("""
            from mlfs.backends.linux.bio import build
            print(build())
            """)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MLFS_BPF_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cache_is_0755_and_the_loader_root_only_writable_under_umask_0(built):
    cache = built.parent.parent
    for where in (cache.parent, cache, built.parent):
        assert _mode(where) == 0o755, where
    assert _mode(built) == 0o755
    assert _mode(built.parent / bio.LOADER_HASH) == 0o644
    assert bio.untrusted(built) is None


@pytest.fixture
def cached(built, monkeypatch) -> Path:
    monkeypatch.setattr(bio, "CACHE", built.parent.parent)
    return built


def test_a_cached_loader_in_a_world_writable_directory_is_refused(cached):
    cached.parent.chmod(0o777)
    try:
        with pytest.raises(SettingError, match="writable by group or others"):
            bio.build()
    finally:
        cached.parent.chmod(0o755)
    assert bio.build() == cached


def test_a_replaced_loader_is_refused_by_its_hash(cached):
    original = cached.read_bytes()
    try:
        cached.write_bytes(b"#!/bin/sh\necho PLANTED\n")
        with pytest.raises(SettingError, match="sha256"):
            bio.build()
    finally:
        cached.write_bytes(original)
    assert bio.build() == cached


def test_a_loader_owned_by_another_user_is_refused(cached):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(cached, 65534, -1)
    try:
        assert "owned by uid 65534" in bio.untrusted(cached)
    finally:
        os.chown(cached, 0, -1)
        cached.chmod(0o755)  # chown clears nothing here, but keep the mode exact
