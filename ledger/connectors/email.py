"""E-mail messages through Django's mail backend (SMTP in production): the connector named "email".

SMTP cannot be asked afterwards whether a message arrived, so what the server said decides:

- no connection, or a failed TLS or login: nothing was offered -> `NotSent` (a new attempt;
  a refused login is named as such, so wrong credentials are plain in the evidence);
- a 4xx reply (to MAIL, RCPT or DATA): the server took nothing and asks to come back -> `NotSent`;
- a 5xx reply: a definite no -> `Rejected`;
- a dropped connection or a timeout once DATA was sent, or a reply that cannot be read: the
  message may have been accepted -> `OutcomeUnknown`. Verification cannot help (`find_effect`
  says it cannot tell), so the executor hands the action to a person with the evidence; it is
  never sent again blindly.

Every attempt for one operation key carries the same `Message-ID`, derived from the key, so a
person (or a mail server's log) can tell whether it went out.
"""

import contextlib
import hashlib
import smtplib
import socket
import threading
import traceback
from email.utils import parseaddr

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from . import http
from .base import Connector, Effect, Lookup

# Backends that accept a message and deliver it to no one.
_UNDELIVERING = {
    "django.core.mail.backends.console.EmailBackend",
    "django.core.mail.backends.dummy.EmailBackend",
    "django.core.mail.backends.filebased.EmailBackend",
    "django.core.mail.backends.locmem.EmailBackend",
}


def message_id(operation_key):
    domain = parseaddr(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2]
    return f"<{hashlib.sha256(operation_key.encode()).hexdigest()}@{domain}>"


class EmailConnector(Connector):
    name = "email"
    verifiable = False

    def __init__(self):
        # No options: the mail server is Django's EMAIL_* settings.
        super().__init__()

    def check(self):
        problems = []
        if "@" not in parseaddr(settings.DEFAULT_FROM_EMAIL)[1]:
            problems.append(f"DEFAULT_FROM_EMAIL {settings.DEFAULT_FROM_EMAIL!r} is not an address with a domain")
        if settings.EMAIL_HOST_USER and not settings.EMAIL_HOST_PASSWORD:
            problems.append("EMAIL_HOST_USER is set without EMAIL_HOST_PASSWORD")
        if settings.PRODUCTION and settings.EMAIL_BACKEND in _UNDELIVERING:
            problems.append(f"EMAIL_BACKEND {settings.EMAIL_BACKEND} delivers no mail")
        return problems

    def _send(self, action):
        params = action.params
        if params.get("channel") != "email":
            raise http.Rejected(f"the email connector sends e-mail, not {params.get('channel')!r}",
                                code="channel_not_supported")
        mid = message_id(action.operation_key)
        message = EmailMessage(
            subject=params["message_type"].replace("_", " ").capitalize(), body=params["body"],
            to=[action.target], headers={"Message-ID": mid},
        )
        # The message is held to the call's deadline (CONNECTOR_TIMEOUT, never past the claim's
        # lease: Connector.perform), not each step to a timeout of its own: a server that drips
        # its answers must not take a message in after the sweeper may have given the action to
        # a person. Opening the session (each of its steps waits at most what was left when it
        # began), nothing is sent, and nothing will be if the deadline passed meanwhile; from the
        # message's first command to the session's end the socket is shut at the deadline: a step
        # waiting, or one that starts after, fails (before DATA, nothing was sent; inside it, the
        # outcome is unknown).
        left = http.time_left()
        if left <= 0:
            raise http.NotSent(f"{mid}: the deadline had passed before the call", code="deadline_passed")
        connection = get_connection(timeout=left)
        try:
            connection.open()
        except smtplib.SMTPAuthenticationError as exc:
            raise http.NotSent(f"{mid}: the mail server refused the login (EMAIL_HOST_USER, EMAIL_HOST_PASSWORD): "
                               f"{exc!r}", code="smtp_login_refused") from exc
        except OSError as exc:
            raise http.NotSent(f"{mid}: no SMTP session: {exc!r}", code="smtp_connect_failed") from exc
        if http.time_left() <= 0:
            connection.close()
            raise http.NotSent(f"{mid}: the deadline passed while the session opened; nothing was sent",
                               code="deadline_passed")
        cut = threading.Timer(http.time_left(), _shut, [connection])
        cut.start()
        try:
            connection.send_messages([message])
        except OSError as exc:  # smtplib's errors are OSErrors too
            raise _outcome(exc, mid) from exc
        finally:
            connection.close()  # QUIT too is held to the deadline (a failed one is no failed message)
            cut.cancel()
        return Effect(external_ref=mid, result={"message_id": mid, "recipient": action.target, "accepted": True})

    def find_effect(self, action):
        return Lookup(found=None, evidence={
            "reason": "SMTP cannot be asked whether a message arrived; look for its Message-ID in the mail logs",
            "message_id": message_id(action.operation_key),
        })


def _shut(connection):
    """The call's deadline: the SMTP session's socket is shut, whatever step it is at."""
    sock = getattr(connection.connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _outcome(exc, mid):
    """The ProviderError for a failure once the session was open (see the module's docstring)."""
    code = _reply_code(exc)
    if 500 <= code < 600:
        return http.Rejected(f"{mid}: refused: {exc}", code=f"smtp_{code}", status=code)
    if 400 <= code < 500:
        return http.NotSent(f"{mid}: deferred: {exc}", code=f"smtp_{code}", status=code)
    if isinstance(exc, smtplib.SMTPDataError) or _inside_data(exc):
        return http.OutcomeUnknown(f"{mid}: no answer to the message once DATA was sent: {exc!r}",
                                   code="smtp_connection_lost")
    return http.NotSent(f"{mid}: the session ended before DATA: {exc!r}", code="smtp_connection_lost")


def _reply_code(exc):
    if isinstance(exc, smtplib.SMTPResponseException):
        return exc.smtp_code
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return min(code for code, _ in exc.recipients.values())
    return 0


def _inside_data(exc):
    # smtplib raises the same SMTPServerDisconnected for a drop before MAIL as after the
    # message's last line: only where it was raised says whether the server could have it.
    return any(frame.f_code is smtplib.SMTP.data.__code__ for frame, _ in traceback.walk_tb(exc.__traceback__))
