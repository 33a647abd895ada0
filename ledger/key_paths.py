"""An operation key or a task id in a URL path, as the API's resources name them and the shards'
router and the connectors send them: Django-free, as the router runs without Django."""

from urllib.parse import quote


def key_segment(key, *, keep=""):
    """`key` as one segment of a URL path: percent-encoded, "/" included, and "." and ".." too,
    which HTTP clients and proxies would otherwise remove as dot segments ("/api/v1/actions/.." is
    "/api/v1"). `keep`: characters a segment may hold as they are (RFC 3986, 3.3), as the API's
    own resources keep ":" and "@" ("/api/v1/actions/refund:ORD-8841:dec-77", `resource_segment`).
    What the connectors send a provider stays encoded whole, as documented for a team's service
    (docs/connectors.md), which may match the path as it arrives."""
    return "%2E" * len(key) if key in (".", "..") else quote(key, safe=keep)


def resource_segment(key):
    """`key` in the URL of the API's action or task resource, ":" and "@" as they are."""
    return key_segment(key, keep=":@")
