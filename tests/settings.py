"""The settings the tests run with: the product's own, with a fast password hasher.

pytest names this module (pyproject.toml) and puts it in the environment, so the gunicorn
server and the RQ workers the tests start run with it too: a password set in a test must be
checked by the same hasher in the server. Nothing else names it, so a deployment keeps
Django's slow-on-purpose hashers; with PRODUCTION set it refuses to load at all.
"""

from config.settings import *  # noqa: F403

if PRODUCTION:  # noqa: F405
    raise RuntimeError("tests.settings is for the test suite; production runs config.settings")

# PBKDF2 takes most of a second per password by design; every test that makes a person pays it.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests that plant a second effect at the sandbox on purpose must not find an incident opened
# for it by a sweeper pass; the reconciliation tests switch the schedule on themselves.
RECONCILE_INTERVAL_SECONDS = 0
