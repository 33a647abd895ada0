"""The settings `make run` starts every process with: the product's own, quieter for a person
watching the processes' output in one terminal.

- Alert e-mails are written one file each under artifacts/mail/ (EMAIL_FILE_PATH): the
  console backend printed every alert in full among the processes' output.
- A refused request (403, 404) is the one line of gunicorn's access log; with DEBUG on,
  Django also logged each with a traceback. Errors (5xx) are still logged with theirs.
"""

from config.settings import *  # noqa: F403

if PRODUCTION:  # noqa: F405
    raise RuntimeError("config.local is for `make run`; production runs config.settings")

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")  # noqa: F405
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(BASE_DIR / "artifacts" / "mail"))  # noqa: F405
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "django.request": {"level": "ERROR"}}}  # noqa: F405
