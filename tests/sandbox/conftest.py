import pytest

API_KEY = "sandbox-test-key"


class SandboxClient:
    """Django's test client speaking JSON to /sandbox/v1/ with a bearer token."""

    def __init__(self, client, token):
        self.client = client
        self.token = token

    def _headers(self, idempotency_key=None):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"}
        if idempotency_key is not None:
            headers["HTTP_IDEMPOTENCY_KEY"] = idempotency_key
        return headers

    def post(self, path, body, *, idempotency_key=None):
        return self.client.post(
            f"/sandbox/v1/{path}", body, content_type="application/json", **self._headers(idempotency_key)
        )

    def put(self, path, body):
        return self.client.put(f"/sandbox/v1/{path}", body, content_type="application/json", **self._headers())

    def get(self, path, **params):
        return self.client.get(f"/sandbox/v1/{path}", params, **self._headers())

    def delete(self, path):
        return self.client.delete(f"/sandbox/v1/{path}", **self._headers())


@pytest.fixture(autouse=True)
def sandbox_settings(settings):
    settings.ROOT_URLCONF = f"{__package__}.urls"
    settings.SANDBOX_API_KEY = API_KEY
    settings.SANDBOX_TIMEOUT_SLEEP = 0.05
    return settings


@pytest.fixture
def sandbox(client):
    return SandboxClient(client, API_KEY)
