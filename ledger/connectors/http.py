"""Every outbound HTTP call goes through here: explicit timeouts and three kinds of failure.

- `NotSent`: the request provably never reached the provider (no connection). Safe to retry.
- `OutcomeUnknown`: it may have been received and acted on (timeout while waiting, dropped
  connection, 5xx). Never retried blindly: the effect must be looked up first.
- `Rejected`: the provider answered with a definite no (4xx, a decline). Permanent.

`CONNECTOR_TIMEOUT` is one deadline for the whole call. httpx's timeouts hold per phase
(connect, write, each read), so a provider that answers a byte at a time could keep a call
going far past it, and past the lease the executor checked before calling (DESIGN: a worker
never starts a call it may not finish inside its lease). So the call runs on a thread of its
own and the caller waits for it at most until the deadline: then it is `OutcomeUnknown`, and
whatever arrives later is dropped.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as DeadlinePassed

import httpx
from django.conf import settings

from ..compiled import register_cache


class ProviderError(Exception):
    def __init__(self, message, *, code="provider_error", status=None):
        super().__init__(message)
        self.code = code
        self.status = status

    def evidence(self):
        return {"error": type(self).__name__, "code": self.code, "status": self.status, "message": str(self)}


class NotSent(ProviderError):
    pass


class OutcomeUnknown(ProviderError):
    pass


class Rejected(ProviderError):
    pass


_clients = {}


def _close_clients():
    """Close the pooled connections too: an idle one may hold a server's thread (and its
    database connection) open."""
    for client in _clients.values():
        client.close()
    _clients.clear()


register_cache("ledger.connectors.http._clients", holds="one pooled HTTP client per process", clear=_close_clients,
               stale_when="the process forks (the key is its pid)")


def _client():
    # One pooled client per process (workers may be forked after import).
    pid = os.getpid()
    if pid not in _clients:
        _clients.clear()
        _clients[pid] = httpx.Client(timeout=settings.CONNECTOR_TIMEOUT, follow_redirects=False)
    return _clients[pid]


# Calls in flight at once per process: the drain lanes' and the web side's alerts, with room
# for calls past their deadline that are still finishing in the background.
_calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="provider-call")


def call(method, url, *, json=None, content=None, params=None, headers=None):
    """Send one request; return the decoded JSON body of a 2xx answer or raise a ProviderError."""
    request = _calls.submit(_client().request, method, url, json=json, content=content, params=params,
                            headers=headers, timeout=settings.CONNECTOR_TIMEOUT)
    try:
        response = request.result(timeout=settings.CONNECTOR_TIMEOUT)
    except DeadlinePassed:
        if request.cancel():  # never started: every thread was busy
            raise NotSent(f"{method} {url}: no thread free to call within {settings.CONNECTOR_TIMEOUT}s",
                          code="busy") from None
        raise OutcomeUnknown(f"{method} {url}: no complete answer within {settings.CONNECTOR_TIMEOUT}s",
                             code="timeout") from None
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise NotSent(f"{method} {url}: {exc!r}", code="connect_failed") from exc
    except httpx.TimeoutException as exc:
        raise OutcomeUnknown(f"{method} {url}: no answer within {settings.CONNECTOR_TIMEOUT}s", code="timeout") from exc
    except httpx.TransportError as exc:
        raise OutcomeUnknown(f"{method} {url}: {exc!r}", code="connection_lost") from exc
    body = _json_or_text(response)
    if response.is_success:
        return body
    if response.status_code >= 500:
        raise OutcomeUnknown(
            f"{method} {url}: HTTP {response.status_code}", code=f"http_{response.status_code}",
            status=response.status_code,
        )
    if response.status_code == 429:
        raise NotSent(f"{method} {url}: rate limited", code="rate_limited", status=429)
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else f"http_{response.status_code}"
    message = error.get("message") if isinstance(error, dict) else f"HTTP {response.status_code}"
    raise Rejected(f"{method} {url}: {message}", code=code or "rejected", status=response.status_code)


def _json_or_text(response):
    try:
        return response.json()
    except ValueError:
        return {"text": response.text[:2000]}
