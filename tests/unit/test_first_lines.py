"""The URL serve's first lines point at is one a client on this machine reaches."""

from __future__ import annotations

import pytest

from infinity_cloud.targets.local.first_lines import base_url


@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", "http://127.0.0.1:7997/api"),
    ("0.0.0.0", "http://127.0.0.1:7997/api"),  # listens everywhere: the loopback is one of them
    ("::", "http://[::1]:7997/api"),
    ("fe80::1", "http://[fe80::1]:7997/api"),
    ("localhost", "http://localhost:7997/api"),
])
def test_a_wildcard_host_is_shown_as_the_loopback(host: str, expected: str) -> None:
    assert base_url(host, 7997, "/api") == expected
