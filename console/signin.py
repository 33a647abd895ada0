"""Who may sign in, the second factor the deciding roles must have, and the audit trail of both.

Sign-in itself is django-allauth's (docs/signin.md): the company's OpenID Connect provider,
local passwords while PASSWORD_SIGN_IN is on, TOTP, WebAuthn passkeys and recovery codes. This
module adds the rules allauth leaves to a project:

- The provider vouches for who someone is, not for who may work here: a person signs in through
  it only if an active person with the e-mail address it vouches for (`email_verified`) already
  exists. Nobody is created, so no role is ever given by the provider.
- With MFA_REQUIRED, a person in a role that can decide money or authority who has no second
  factor is sent to enrol one before any page.
- Every sign-in, failure, refusal, sign-out, and second factor added, removed, used to step up or
  failed is an audit event, written from allauth's and Django's signals.
- A session whose person typed STEP_UP_WRONG_CODES wrong codes in a row at the factor page, in
  any of their sessions and under any of their names, is signed out (`wrong_codes_in_a_row`).
"""

from itertools import takewhile

from allauth.account.adapter import DefaultAccountAdapter, get_adapter
from allauth.account.authentication import get_authentication_records
from allauth.account.internal.flows.login import AUTHENTICATION_METHODS_SESSION_KEY
from allauth.core import context
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.mfa import signals as mfa_signals
from allauth.mfa.models import Authenticator
from allauth.mfa.utils import is_mfa_enabled
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.conf import settings
from django.contrib.auth import get_user_model, logout
from django.contrib.auth import signals as auth_signals
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.http import Http404, HttpResponseRedirect
from django_htmx.http import HttpResponseClientRedirect

from ledger.models import AuditEvent
from ledger.roles import decides

SIGN_IN_ACTOR = "system:sign-in"
SECOND_FACTORS = [Authenticator.Type.TOTP, Authenticator.Type.WEBAUTHN]
# The wrong codes in a row at the factor page (a step-up, or a change of one's factors) that sign a
# session out: a person mistypes one or two, a guesser needs hundreds of thousands (decision 64).
STEP_UP_WRONG_CODES = 5
# What a person without a second factor can still reach: the sign-in and enrolment pages, and
# what no session uses (the agents' API, the providers' webhooks, monitoring, static files).
NEEDS_NO_FACTOR = ("/accounts/", "/api/", "/webhooks/", "/sandbox/", "/metrics", "/site-probe",
                   f"/{settings.STATIC_URL.lstrip('/')}")


def has_second_factor(user):
    return is_mfa_enabled(user, SECOND_FACTORS)


def redirect(request, url):
    """A redirect the page follows, an htmx request included (HX-Redirect: a whole page)."""
    return HttpResponseClientRedirect(url) if getattr(request, "htmx", False) else HttpResponseRedirect(url)


class SecondFactorRequiredMiddleware:
    """With MFA_REQUIRED, a deciding person without a second factor is sent to enrol one."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if (settings.MFA_REQUIRED and not request.path.startswith(NEEDS_NO_FACTOR)
                and request.user.is_authenticated and not has_second_factor(request.user)
                and decides(request.user)):
            return redirect(request, reverse("mfa_index"))
        return self.get_response(request)


def factors_given(records):
    """The ids of the second factors a session gave, at sign-in or since (allauth's records)."""
    return {record["id"] for record in records if record.get("method") == "mfa" and "id" in record}


# The ids of the second factors (passkeys, authenticator apps) a session enrolled. Kept apart from
# allauth's records of factors given, which count as a step-up (console.stepup.fresh_factor):
# enrolling one proves nothing the session did not have already. Recovery codes, made with a
# factor and made again on request, are not one.
FACTORS_ENROLLED = "factors_enrolled"


def factors_of_session(request, records):
    """The second factors a session stands on: those it gave and those it enrolled."""
    return factors_given(records) | set(request.session.get(FACTORS_ENROLLED, ()))


class SessionLifetimeMiddleware:
    """A session ends SESSION_COOKIE_AGE after its sign-in, however often it was saved since.
    Django's session store moves a session's end on every save, and a step-up saves it: a person
    who stepped up every few hours stayed signed in for good.

    It also ends once a second factor it gave or enrolled is removed (by an admin, or by the person
    in another session): a factor is removed because it was lost or stolen, or was never the
    person's, and the session it opened, or that enrolled it after a stolen password, went on,
    counted that factor as a step-up, or, left with no factor, enrolled another unasked."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # A session the database cannot read now is never served unchecked: the error goes up, and
        # the server answers the outage (config.urls.handler500: 503).
        if request.user.is_authenticated:
            records = get_authentication_records(request, request.user)
            given = factors_of_session(request, records)
            if records and timezone.now().timestamp() - records[0]["at"] >= settings.SESSION_COOKIE_AGE:
                request.session_ended = "session_expired"  # audited as such, not as the person's signing out
                logout(request)
            elif given and Authenticator.objects.filter(user_id=request.user.pk, pk__in=given).count() < len(given):
                request.session_ended = "session_revoked"
                logout(request)
        return self.get_response(request)


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request):
        return False  # people are made by an admin (manage.py, the admin site), with their role

    def authenticate(self, request, **credentials):
        # A deactivated person's right password is answered as a wrong one, and counted as one:
        # allauth's "This account is inactive" told whoever guessed it that the name is a person's
        # and the password is right (a departed person's, still good wherever else they used it).
        user = super().authenticate(request, **credentials)
        if user is not None and not user.is_active:
            self.pre_authenticate(request, **credentials)  # allauth handed back the try a right one counts as
            return None
        return user

    def is_reauthentication_required(self, *, app, **kwargs):
        # A person's first second factor is enrolled right after sign-in, with nothing stronger to
        # ask for (someone signed in through the company's provider has no password here); adding
        # or removing one once a factor exists asks for it again.
        if app == "allauth.mfa" and not has_second_factor(context.request.user):
            return False
        return super().is_reauthentication_required(app=app, **kwargs)


def addresses_set_by_an_admin(request):
    """allauth's page where a person adds and chooses their own e-mail addresses, closed: the
    address is who the company's provider signs them in as (`known_person`) and where a password
    reset goes, so it is set by an admin, never by the session itself."""
    raise Http404("a person's e-mail address is set by an admin")


def passwords_set_by_an_admin(request):
    """allauth's page where a person without a password (one who signs in through the company's
    provider) sets one, closed: it asked nothing, so any of their sessions could make itself a way
    in past the provider. A local password is an admin's to give, as the person is."""
    raise Http404("a password is set by an admin")


def known_person(sociallogin):
    """The one active person with an e-mail address the provider vouches for, or None."""
    emails = {address.email for address in sociallogin.email_addresses if address.verified and address.email}
    people = [p for email in emails for p in get_user_model().objects.filter(email__iexact=email, is_active=True)]
    return people[0] if len(people) == 1 else None


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin):
        return False

    def pre_social_login(self, request, sociallogin):
        if sociallogin.is_existing:
            return
        person = known_person(sociallogin)
        if person is None:
            claims = sociallogin.account.extra_data
            who = next((a.email for a in sociallogin.email_addresses), "") or sociallogin.account.uid
            audit_sign_in_failure(request, who, "not_allowed", provider=sociallogin.account.provider,
                                  email_verified=(claims.get("userinfo") or claims.get("id_token") or {}).get(
                                      "email_verified"))
            raise ImmediateHttpResponse(render(request, "account/not_allowed.html", {"who": who}, status=403))
        sociallogin.connect(request, person)

    def on_authentication_error(self, request, provider, error=None, exception=None, extra_context=None):
        audit_sign_in_failure(request, "", str(error or "error"), provider=provider.sub_id,
                              detail=str(exception or "")[:200])


# --- the audit trail --------------------------------------------------------------------------

def _client(request):
    """The client's address as the sign-in limits count it: behind the load balancer, its entry in
    X-Forwarded-For (TRUSTED_PROXY_COUNT); REMOTE_ADDR would name the balancer for everyone."""
    if request is None:
        return {}
    try:
        return {"ip": get_adapter(request).get_client_ip(request)}
    except PermissionDenied:  # allauth's answer when no address is known at all
        return {"ip": ""}


def _methods(request, user):
    """How this session's person proved who they are: allauth's records, without their secrets."""
    keep = ("method", "type", "provider", "reauthenticated")
    return [{k: record[k] for k in keep if k in record} for record in get_authentication_records(request, user)]


def audit_sign_in_failure(request, who, why, **details):
    person = get_user_model().objects.filter(username=who).first() if who else None
    with transaction.atomic():
        # An attempt under a name nobody has is recorded against that name (an unsaved person).
        AuditEvent.objects.record(actor=SIGN_IN_ACTOR, verb="sign_in_failed",
                                  obj=person or get_user_model()(username=who[:150]),
                                  after={"who": who, "why": why, **details, **_client(request)})


# The id of the session's own signed_in event: no run of wrong codes reaches past it, so the count
# reads from there on (`wrong_codes_in_a_row`).
SIGNED_IN_EVENT = "signed_in_event"


@receiver(auth_signals.user_logged_in)
def audit_signed_in(sender, request, user, **kwargs):
    with transaction.atomic():
        event = AuditEvent.objects.record(actor=user, verb="signed_in", obj=user,
                                          after={"methods": _methods(request, user), **_client(request)})
    request.session[SIGNED_IN_EVENT] = event.pk


@receiver(auth_signals.user_logged_out)
def audit_signed_out(sender, request, user, **kwargs):
    if user is not None:
        ended = getattr(request, "session_ended", None)  # by SessionLifetimeMiddleware, not the person
        with transaction.atomic():
            AuditEvent.objects.record(actor=SIGN_IN_ACTOR if ended else user, verb=ended or "signed_out",
                                      obj=user, after=_client(request))


@receiver(auth_signals.user_login_failed)
def audit_password_failed(sender, credentials, request=None, **kwargs):
    audit_sign_in_failure(request, str(credentials.get("username") or ""), "password")


def _audit_factor(verb, request, user, authenticator, **after):
    with transaction.atomic():
        AuditEvent.objects.record(actor=user, verb=verb, obj=authenticator,
                                  after={"type": authenticator.type, **after, **_client(request)})


# A factor added or removed is recorded by the model's own signals, in the transaction that adds
# or removes it: allauth's authenticator_added comes after that commit, and a crash between the
# two would leave a factor nobody saw added. The person is the request's (an admin removing
# someone's factor on the admin site is that admin), else the factor's owner.
def _changed_by(authenticator):
    user = getattr(context.request, "user", None)
    return user if user is not None and user.is_authenticated else authenticator.user


@receiver(post_save, sender=Authenticator)
def audit_factor_added(sender, instance, created, **kwargs):
    if created:
        _audit_factor("second_factor_added", context.request, _changed_by(instance), instance)


@receiver(mfa_signals.authenticator_added)
def remember_factor_enrolled(sender, request, authenticator, **kwargs):
    # allauth's signal, after the factor's commit: a factor rolled back is never the session's.
    if authenticator.type in SECOND_FACTORS:
        request.session[FACTORS_ENROLLED] = [*request.session.get(FACTORS_ENROLLED, ()), authenticator.pk]


@receiver(post_delete, sender=Authenticator)
def audit_factor_removed(sender, instance, **kwargs):
    _audit_factor("second_factor_removed", context.request, _changed_by(instance), instance,
                  of=instance.user.get_username())
    # The person's own session that removes it (asked for a factor just before) stays signed in:
    # it forgets having given or enrolled this one, so SessionLifetimeMiddleware ends only the others.
    request = context.request
    session = getattr(request, "session", None)
    if session is not None and getattr(request, "user", None) == instance.user:
        records = get_authentication_records(request, instance.user)
        if instance.pk in factors_given(records):
            session[AUTHENTICATION_METHODS_SESSION_KEY] = [
                r for r in records if not (r.get("method") == "mfa" and r.get("id") == instance.pk)]
        if instance.pk in session.get(FACTORS_ENROLLED, ()):
            session[FACTORS_ENROLLED] = [pk for pk in session[FACTORS_ENROLLED] if pk != instance.pk]


@receiver(mfa_signals.authenticator_reset)
def audit_factor_reset(sender, request, user, authenticator, **kwargs):
    _audit_factor("second_factor_reset", request, user, authenticator)


@receiver(mfa_signals.authenticator_used)
def audit_stepped_up(sender, request, user, authenticator, reauthenticated=False, **kwargs):
    if reauthenticated:  # a sign-in's factor is in its signed_in event
        # About the person, as their signed_in and second_factor_failed are, the factor named in
        # `after`: `wrong_codes_in_a_row` reads the three by the person's id, which a rename keeps.
        with transaction.atomic():
            AuditEvent.objects.record(actor=user, verb="stepped_up", obj=user, after={
                "type": authenticator.type, "factor": authenticator.pk, **_client(request)})


@receiver(mfa_signals.authentication_failed)
def audit_factor_failed(sender, request, user, authenticator=None, reauthentication=False, **kwargs):
    with transaction.atomic():
        AuditEvent.objects.record(actor=user, verb="second_factor_failed", obj=user, after={
            "type": getattr(authenticator, "type", ""), "step_up": bool(reauthentication), **_client(request)})
    # Committed first: a wrong code typed at the same moment in another session, counting after its
    # own commit, sees this one, so the last of a run counts them all.
    since = request.session.get(SIGNED_IN_EVENT, 0)  # a session signed in before it was kept: none
    if reauthentication and wrong_codes_in_a_row(user, since) >= STEP_UP_WRONG_CODES:
        request.session_ended = "session_locked_out"
        logout(request)
        # allauth's way out of its form's check (AccountMiddleware answers it): the page says why.
        raise ImmediateHttpResponse(render(request, "account/locked_out.html",
                                           {"wrong_codes": STEP_UP_WRONG_CODES}, status=403))


def wrong_codes_in_a_row(user, since=0):
    """How many codes the person typed wrong at the factor page since their latest factor given, at
    sign-in or there, in any of their sessions (up to STEP_UP_WRONG_CODES): read from the audit trail,
    which has each, in the database every process shares. Per person, not per session: counted per
    session, each of the person's open sessions a thief holds would have its own run of guesses. A
    sign-in since gave a factor (allauth asks a person who has one at every sign-in): it starts again.
    A passkey refused is not counted (allauth sends no signal for it): nobody guesses one.

    The events are read as about the person (their id), not as theirs (their label, `user:USERNAME`):
    renamed, a person's wrong codes counted from none. `since`, the id of the asking session's own
    signed_in event, bounds the index scan (on the object and id) to the session's hours: the planner,
    taking a person's id for a rare value of a column that names every other object too, otherwise
    read and sorted every one of their events the trail keeps (decision 64)."""
    latest = AuditEvent.objects.history(user).filter(
        Q(verb="second_factor_failed", after__step_up=True) | Q(verb__in=("signed_in", "stepped_up")),
        id__gte=since).order_by("-id").values_list("verb", flat=True)[:STEP_UP_WRONG_CODES]
    return len(list(takewhile(lambda verb: verb == "second_factor_failed", latest)))
