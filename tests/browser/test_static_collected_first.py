"""The browser tests' server (DEBUG off) serves static files from STATIC_ROOT, and WhiteNoise
indexes that directory once, as the server starts. The static files were collected by the first
browser fixture, after the server had started: a run right after a change to the dashboard's
JavaScript (or in a fresh clone, with nothing collected) served the old file, or none. They are
collected now before any test of the session, and the server serves the sources as they are."""

import urllib.request

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("path", ["js/dashboard.js", "css/app.css"])
def test_the_server_serves_the_static_sources_as_they_are(stack, path):
    with urllib.request.urlopen(f"{stack.url}/static/{path}", timeout=10) as served:
        assert served.read() == (ROOT / "static" / path).read_bytes()
