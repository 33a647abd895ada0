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

# The second factor and step-up are off unless a test asks for them (override_settings, or the
# live server's environment): the rest of the suite signs in with a password alone.
MFA_REQUIRED = env_bool("MFA_REQUIRED", False)  # noqa: F405
STEP_UP_SECONDS = env_float("STEP_UP_SECONDS", 0)  # noqa: F405
ACCOUNT_REAUTHENTICATION_TIMEOUT = STEP_UP_SECONDS or 300
# Chromium's virtual authenticator serves http://localhost: a browser allows WebAuthn there.
MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True
