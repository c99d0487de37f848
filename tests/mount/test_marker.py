"""tests/mount/conftest.py marks every test here `mount` (so -m "not mount" skips them)."""

import pytest


def test_every_test_under_tests_mount_is_marked_mount(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("mount") is not None
