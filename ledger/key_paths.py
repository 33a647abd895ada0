"""An operation key or a task id in a URL path, as the API's resources name them and the shards'
router forwards them: Django-free, as the router runs without Django."""

from urllib.parse import quote


def key_segment(key):
    """`key` as one segment of a URL path: percent-encoded, "/" included, and "." and ".." too,
    which HTTP clients and proxies would otherwise remove as dot segments ("/api/v1/actions/.." is
    "/api/v1")."""
    return "%2E" * len(key) if key in (".", "..") else quote(key, safe="")
