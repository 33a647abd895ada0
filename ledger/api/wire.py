"""The agents' API's wire format where it needs no Django: an operation key's form and a
problem's body (RFC 9457). The API reads them here, and so does the shards' router
(sharding/router.py), which runs without Django and must refuse and answer as the API does."""

PROBLEM_TYPE = "https://surety.dev/problems/"


def well_formed_key(key):
    """An operation key (Idempotency-Key): 1 to 255 printable ASCII characters."""
    return key is not None and 1 <= len(key) <= 255 and all(" " <= ch <= "~" for ch in key)


def problem_body(status_code, code, title, detail, errors=None):
    body = {"type": PROBLEM_TYPE + code, "title": title, "status": status_code, "detail": detail, "code": code}
    if errors:
        body["errors"] = errors
    return body
