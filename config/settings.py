"""Settings, read from the environment variables listed in docs/configuration.md.

With no configuration but DEBUG=true (development values: below) the app runs on a SQLite file
(IMMEDIATE transactions) and on Redis at localhost if it answers, else runs jobs in-process;
`ledger.apps` announces which on start.
"""

import ipaddress
import os
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name, default=None):
    return os.environ.get(name, default)


def env_bool(name, default=False):
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name, default):
    return float(os.environ.get(name, default))


def env_int(name, default):
    return int(os.environ.get(name, default))


def env_list(name, default=""):
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
PRODUCTION = env_bool("PRODUCTION", False)

# Development values only when DEBUG is on (docs/contract.md): this key is public, in the repository,
# and signs sessions, evidence records and audit checkpoints. With DEBUG off, PRODUCTION or not,
# SECRET_KEY must be set and ALLOWED_HOSTS defaults to none (Django then answers every request 400,
# logging the host to add), as a deployment that forgot PRODUCTION must not run on development values.
_DEV_SECRET = "dev-only-secret-key-never-used-in-production-0123456789abcdef"
SECRET_KEY = env_str("SECRET_KEY") or (_DEV_SECRET if DEBUG else None)
if not SECRET_KEY:
    raise RuntimeError(
        "SECRET_KEY must be set when DEBUG is off: set SECRET_KEY to a long random value (python -c "
        "'import secrets; print(secrets.token_urlsafe(50))'), or DEBUG=true for local development only")
# Earlier keys, after a rotation (docs/operations.md): what they signed still verifies (sessions,
# the audit chain's checkpoints, evidence records); everything new is signed with SECRET_KEY.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver" if DEBUG else "")

INSTALLED_APPS = [
    "console.apps.AdminConfig",  # Django's admin, its changes stepped up
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_rq",
    "django_htmx",
    "template_partials",
    "guardian",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.mfa",
    "ledger",
    "sandbox",
    "approvals",
    "dlq",
    "console",
    "demo",
]

MIDDLEWARE = [
    "ledger.middleware.RequestIdMiddleware",  # every answer names its request, the health checks' too
    "console.monitoring.HealthChecksMiddleware",  # for any Host, over plain HTTP: before the host is read
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "ledger.api.unavailable.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "console.stepup.StashedDecisionMiddleware",
    "console.signin.SessionLifetimeMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.signin.SecondFactorRequiredMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        conn_max_age=600,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so two writers queue instead of failing
    # with "database is locked" halfway through a transaction.
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
else:
    # Values bound by the server, so psycopg can prepare a statement after its second run:
    # the same few statements run on every request, and planning them each time cost
    # PostgreSQL more than running them.
    DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=2)
    # A primary that vanishes without closing its connections (a host lost, a network split, a
    # frozen VM) must not hold a statement in recv() for the kernel's 15 minutes (unacknowledged)
    # or 2 hours (before its first keepalive): every sweeper and drain lane would hang, and none
    # reconnect after the failover. A connection idle 10 s is probed (3 probes 5 s apart), data
    # unacknowledged for DATABASE_TCP_USER_TIMEOUT_MS ends it (Linux), and a connection attempt
    # gives up after DATABASE_CONNECT_TIMEOUT seconds: each is an error the outage handling waits out.
    DATABASES["default"]["OPTIONS"].update(
        keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
        tcp_user_timeout=env_int("DATABASE_TCP_USER_TIMEOUT_MS", 15000),
        connect_timeout=env_int("DATABASE_CONNECT_TIMEOUT", 5))
    # A persistent connection the database dropped while it sat idle (a failover, a restarted
    # pooler, an idle timeout) is found out by a request's first statement and replaced,
    # instead of failing that request. Its cost (`make bench BENCH_ARGS=health_checks`, CPU per
    # request checked / unchecked, median of three runs) was 0.95 for a new key and 1.01 for a
    # replay, within the runs' spread; Django's psycopg pool cost the same but waits out its
    # timeout while the database is down (docs/decisions/01-database-blips.md).
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = env_bool("DATABASE_HEALTH_CHECKS", True)
if env_str("TEST_DATABASE_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


# --- Behind a connection pooler --------------------------------------------------------------
def behind_transaction_pooler(database):
    """Behind a transaction-pooling PgBouncer (DATABASE_POOLER=transaction) consecutive
    transactions of one connection may reach different server connections: a statement
    prepared on one is unknown to the next, and a holdable cursor (Django's .iterator()
    outside a transaction) is gone. Values stay bound by the server, in unnamed statements,
    which a pooler passes through."""
    database["OPTIONS"] = {**database.get("OPTIONS", {}), "prepare_threshold": None}
    database["DISABLE_SERVER_SIDE_CURSORS"] = True


DATABASE_POOLER = env_str("DATABASE_POOLER", "")
if DATABASE_POOLER not in ("", "session", "transaction"):
    raise RuntimeError("DATABASE_POOLER must be empty, session or transaction")
if DATABASE_POOLER == "transaction" and DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
    behind_transaction_pooler(DATABASES["default"])

# --- Redis and RQ ---------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_answers(url):
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.3, socket_timeout=0.3).ping())
    except (redis.RedisError, OSError, ValueError):
        return False


# In production Redis is part of the deployment, asked or not: a process that starts while it is
# down (a host booting first, a Redis restart) must not run every job in-process for the rest of
# its life, with /healthz calling Redis "not used"; its rings fail meanwhile, and the sweeper rings
# again once Redis is back.
RQ_ASYNC = env_bool("RQ_ASYNC", True) and (PRODUCTION or _redis_answers(REDIS_URL))
# A Redis that stops answering without refusing (a hung host, a blackholed port) must cost a
# request or a sweeper pass seconds, not forever: every client django-rq builds connects and reads
# within these. They go in the URL, the one place django-rq passes on to redis-py next to a URL.
# An RQ worker's own connection blocks reading for its next job (for its TTL less 15 s, RQ's
# dequeue timeout): RQ raises that connection's read timeout above it itself.
REDIS_CONNECT_TIMEOUT = env_float("REDIS_CONNECT_TIMEOUT", 2)
REDIS_READ_TIMEOUT = env_float("REDIS_READ_TIMEOUT", 2)


def _with_timeouts(url):
    parts = urlsplit(url)
    query = {**dict(parse_qsl(parts.query)), "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
             "socket_timeout": REDIS_READ_TIMEOUT}
    return urlunsplit(parts._replace(query=urlencode(query)))


RQ_QUEUES = {
    "default": {"URL": _with_timeouts(REDIS_URL), "DEFAULT_TIMEOUT": 600, "ASYNC": RQ_ASYNC},
}
RQ = {"WORKER_CLASS": "ledger.worker.Worker"}

# --- Surety ---------------------------------------------------------------------------------
# This deployment's public address: alerts link to it, the replay set's webhook case posts
# its events there, once a signed probe (ledger.site_url) shows it reaches this deployment,
# and the sandbox connector calls this app's own sandbox under it unless told otherwise.
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000")
SANDBOX_ENABLED = env_bool("SANDBOX_ENABLED", not PRODUCTION)
SANDBOX_BASE_URL = env_str("SANDBOX_BASE_URL", f"{SITE_URL.rstrip('/')}/sandbox/v1")
# The sandbox's development key and webhook secret: public, in the repository (`check --deploy`
# refuses them with DEBUG off: ledger.checks.sandbox_secrets).
SANDBOX_DEV_SECRETS = {"SANDBOX_API_KEY": "sandbox-dev-key", "SANDBOX_WEBHOOK_SECRET": "whsec-sandbox-dev"}
SANDBOX_API_KEY = env_str("SANDBOX_API_KEY", SANDBOX_DEV_SECRETS["SANDBOX_API_KEY"])
SANDBOX_WEBHOOK_SECRET = env_str("SANDBOX_WEBHOOK_SECRET", SANDBOX_DEV_SECRETS["SANDBOX_WEBHOOK_SECRET"])
SANDBOX_TIMEOUT_SLEEP = env_float("SANDBOX_TIMEOUT_SLEEP", 10)
# Where the sandbox posts its signed events (empty: it sends none), and how often it sends one
# twice and how late, as real providers do. PUT /sandbox/v1/settings can change all three.
# Off by default: an event could settle an action before the executor's own verification.
SANDBOX_WEBHOOK_URL = env_str("SANDBOX_WEBHOOK_URL", "")
SANDBOX_WEBHOOK_DUPLICATE_RATE = env_float("SANDBOX_WEBHOOK_DUPLICATE_RATE", 0)
SANDBOX_WEBHOOK_DELAY_SECONDS = env_float("SANDBOX_WEBHOOK_DELAY_SECONDS", 0)
if not (0 <= SANDBOX_WEBHOOK_DUPLICATE_RATE <= 1 and SANDBOX_WEBHOOK_DELAY_SECONDS >= 0):
    raise RuntimeError("SANDBOX_WEBHOOK_DUPLICATE_RATE must be from 0 to 1 and SANDBOX_WEBHOOK_DELAY_SECONDS not negative")
CONNECTOR_TIMEOUT = env_float("CONNECTOR_TIMEOUT", 5)
# Reconciliation (dlq/reconcile.py): a run every INTERVAL over the time since the last complete
# run, reaching OVERLAP further back (a provider's record may show a little after its time), and
# never more than LOOKBACK. An interval of 0 switches the schedule off.
RECONCILE_INTERVAL_SECONDS = env_float("RECONCILE_INTERVAL_SECONDS", 300)
RECONCILE_OVERLAP_SECONDS = env_float("RECONCILE_OVERLAP_SECONDS", 3600)
RECONCILE_LOOKBACK_SECONDS = env_float("RECONCILE_LOOKBACK_SECONDS", 86400)
# The schedule reads the 30 days before its windows again, for effects the provider failed since,
# once per this many seconds, a part in each run (dlq.reconcile.late_span): a failure whose webhook
# was lost is found within a day, the webhook's minutes being the rule (decision 66).
RECONCILE_LATE_FAILURES_INTERVAL_SECONDS = env_float("RECONCILE_LATE_FAILURES_INTERVAL_SECONDS", 86400)
if not 0 < RECONCILE_LATE_FAILURES_INTERVAL_SECONDS <= 30 * 86400:  # read less often, a record ages out unread
    raise RuntimeError("RECONCILE_LATE_FAILURES_INTERVAL_SECONDS must be more than 0 and at most 2592000 (30 days)")
# Which connector serves each action type: the registry `ledger.connectors` reads (see
# docs/connectors.md). An entry is {"class": dotted path, "options": {...}}; options come
# from environment variables here. `CONNECTOR_<ACTION_TYPE>` names one of CONNECTOR_CLASSES;
# by default every type goes to the sandbox while it is enabled, and to nothing otherwise
# (a system check then refuses to start).
CONNECTOR_CLASSES = {
    "sandbox": "ledger.connectors.sandbox.SandboxConnector",
    "http": "ledger.connectors.signed_http.SignedHttpConnector",
    "email": "ledger.connectors.email.EmailConnector",
    "stripe": "ledger.connectors.stripe.StripeConnector",
}
# Options of a connector that one provider account gives every action type it serves.
_ACCOUNT_OPTIONS = {"stripe": {
    "api_key": env_str("STRIPE_API_KEY", ""),
    "api_base": env_str("STRIPE_API_BASE", ""),  # empty: Stripe's own
    "webhook_secret": env_str("STRIPE_WEBHOOK_SECRET", ""),
}}
# The options a connector takes, each read from CONNECTOR_<ACTION_TYPE>_<OPTION>.
_CONNECTOR_OPTIONS = {"http": ("url", "secret")}
# The action types (ledger.models.ActionType; a system check compares the two).
ACTION_TYPES = ("refund", "send_message", "create_booking")
SURETY_CONNECTORS = {}
for _action_type in ACTION_TYPES:
    _name = env_str(f"CONNECTOR_{_action_type.upper()}", "sandbox" if SANDBOX_ENABLED else "")
    if _name:
        SURETY_CONNECTORS[_action_type] = {"class": CONNECTOR_CLASSES.get(_name, _name), "options": {
            option: env_str(f"CONNECTOR_{_action_type.upper()}_{option.upper()}", "")
            for option in _CONNECTOR_OPTIONS.get(_name, ())
        }}
        SURETY_CONNECTORS[_action_type]["options"].update(_ACCOUNT_OPTIONS.get(_name, {}))
        # Where the replay set (ledger.replay) calls a team's service in its test mode.
        if env_str(f"CONNECTOR_{_action_type.upper()}_TEST_URL"):
            SURETY_CONNECTORS[_action_type]["test_mode"] = {"options": {
                "url": env_str(f"CONNECTOR_{_action_type.upper()}_TEST_URL")}}
        # And Stripe in its test mode: a test key, by default against the sandbox's Stripe wire
        # format (Stripe's own without the sandbox), and the test-mode endpoint's webhook secret
        # (Stripe signs test and live events with different ones). The replay run stages its
        # faults itself, whatever the base.
        if _name == "stripe" and env_str("STRIPE_TEST_API_KEY"):
            _sandbox_stripe = f"{SANDBOX_BASE_URL.rstrip('/').removesuffix('/v1')}/stripe"
            SURETY_CONNECTORS[_action_type]["test_mode"] = {"options": {
                "api_key": env_str("STRIPE_TEST_API_KEY"),
                "api_base": env_str("STRIPE_TEST_API_BASE", _sandbox_stripe if SANDBOX_ENABLED else ""),
                **({"webhook_secret": env_str("STRIPE_TEST_WEBHOOK_SECRET")} if env_str("STRIPE_TEST_WEBHOOK_SECRET")
                   else {}),
            }}
# A promotion needs a replay run that passed within this many days (ledger.grants.passing_run).
REPLAY_PASS_MAX_AGE_DAYS = env_int("REPLAY_PASS_MAX_AGE_DAYS", 90)
if REPLAY_PASS_MAX_AGE_DAYS < 1:  # no run would ever open the gate, and nobody told why
    raise RuntimeError("REPLAY_PASS_MAX_AGE_DAYS must be at least 1")
# A bulk redrive from the dead-letter queue (dlq/bulk.py) never goes faster than the connectors
# it calls allow: CONNECTOR_<ACTION_TYPE>_REDRIVE_RATE, entries per minute. It stops when
# REDRIVE_SPIKE_FAILURES of the last REDRIVE_SPIKE_WINDOW entries it redrove failed again at the provider.
CONNECTOR_REDRIVE_RATES = {t: env_float(f"CONNECTOR_{t.upper()}_REDRIVE_RATE", 60) for t in ACTION_TYPES}
REDRIVE_SPIKE_FAILURES = env_int("REDRIVE_SPIKE_FAILURES", 3)
REDRIVE_SPIKE_WINDOW = env_int("REDRIVE_SPIKE_WINDOW", 10)
# A run keeps its ceiling with two decimals, below a million a minute (dlq.redrive_runs).
if not (all(0.01 <= rate < 10**6 for rate in CONNECTOR_REDRIVE_RATES.values())
        and 1 <= REDRIVE_SPIKE_FAILURES <= REDRIVE_SPIKE_WINDOW):
    raise RuntimeError("CONNECTOR_<TYPE>_REDRIVE_RATE must be from 0.01 to 999999.99 entries a minute, and "
                       "REDRIVE_SPIKE_FAILURES from 1 to REDRIVE_SPIKE_WINDOW")
LEASE_SECONDS = env_float("LEASE_SECONDS", 30)
# A provider call starts only with at least CONNECTOR_TIMEOUT + this margin of lease left.
LEASE_MARGIN_SECONDS = env_float("LEASE_MARGIN_SECONDS", 2)
MAX_ATTEMPTS = env_int("MAX_ATTEMPTS", 3)
# Backoff between attempts: BACKOFF_BASE * 2**(attempt-1), capped, with equal jitter (ledger.retry).
BACKOFF_BASE_SECONDS = env_float("BACKOFF_BASE_SECONDS", 2)
BACKOFF_MAX_SECONDS = env_float("BACKOFF_MAX_SECONDS", 300)
SWEEP_INTERVAL_SECONDS = env_float("SWEEP_INTERVAL_SECONDS", 1)
# Several sweepers (one per host) elect one leader per step (ledger.sweeper): a leader's lease
# lasts this long after each run, so a dead leader's steps pass to another sweeper after it.
SWEEP_LEASE_SECONDS = env_float("SWEEP_LEASE_SECONDS", max(5, 3 * SWEEP_INTERVAL_SECONDS))
# A sweeper that cannot reach the database or Redis tries again after the interval, doubling, up to this.
SWEEP_BACKOFF_MAX_SECONDS = env_float("SWEEP_BACKOFF_MAX_SECONDS", 5)
# The overview warns when audit events wait longer than this for the sweeper to seal them.
AUDIT_SEAL_ALERT_SECONDS = env_float("AUDIT_SEAL_ALERT_SECONDS", 60)
# The seal signs the chain's hash every this many events (a checkpoint the daily check starts
# from), and the whole-chain check walks this many events per sweeper pass (ledger.audit).
AUDIT_CHECKPOINT_EVERY = env_int("AUDIT_CHECKPOINT_EVERY", 10000)
AUDIT_WALK_BATCH = env_int("AUDIT_WALK_BATCH", 5000)
# PostgreSQL: each partition of the audit trail and of the webhook events holds this many ids
# (ledger.partitions); at a busy team's few million events a week, one to a few weeks each.
PARTITION_EVENTS = env_int("PARTITION_EVENTS", 10_000_000)
if min(AUDIT_CHECKPOINT_EVERY, AUDIT_WALK_BATCH, PARTITION_EVENTS) < 1:
    # a seal would divide by zero, a walk never advance, a partition hold nothing
    raise RuntimeError("AUDIT_CHECKPOINT_EVERY, AUDIT_WALK_BATCH and PARTITION_EVENTS must be at least 1")
# An operation key names its action this long after the action was recorded (decision 42): the
# API's replay holds within it, a request under the key answers 410 after it, and
# `archive_expired` may then move the settled action out of the ledger.
OPERATION_KEY_LIFETIME_DAYS = env_int("OPERATION_KEY_LIFETIME_DAYS", 400)
if OPERATION_KEY_LIFETIME_DAYS < 31:  # shorter than a provider's own retry window (Adyen: 31 days)
    raise RuntimeError("OPERATION_KEY_LIFETIME_DAYS must be at least 31")
# What `archive_expired` moves to its file besides settled actions past the key's lifetime: audit
# events (up to a checkpoint), webhook events and closed dead letters older than these. An
# action's evidence cites them, so none may go before the actions do.
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", OPERATION_KEY_LIFETIME_DAYS)
WEBHOOK_RETENTION_DAYS = env_int("WEBHOOK_RETENTION_DAYS", OPERATION_KEY_LIFETIME_DAYS)
DEAD_LETTER_RETENTION_DAYS = env_int("DEAD_LETTER_RETENTION_DAYS", OPERATION_KEY_LIFETIME_DAYS)
if min(AUDIT_RETENTION_DAYS, WEBHOOK_RETENTION_DAYS, DEAD_LETTER_RETENTION_DAYS) < OPERATION_KEY_LIFETIME_DAYS:
    raise RuntimeError("AUDIT_, WEBHOOK_ and DEAD_LETTER_RETENTION_DAYS must be at least OPERATION_KEY_LIFETIME_DAYS")
# A run by hand reads no further back than the key's lifetime (decision 65), nor may the schedule.
if RECONCILE_LOOKBACK_SECONDS > OPERATION_KEY_LIFETIME_DAYS * 86400:
    raise RuntimeError("RECONCILE_LOOKBACK_SECONDS must be at most OPERATION_KEY_LIFETIME_DAYS")
# Threads per drain job on PostgreSQL (each with a connection): actions and tasks in flight per worker.
DRAIN_LANES = env_int("DRAIN_LANES", 4)
WEBHOOK_TOLERANCE_SECONDS = 300
API_MAX_BODY_BYTES = 64 * 1024
API_MAX_WAIT_SECONDS = 30
ALERT_WEBHOOK_URL = env_str("ALERT_WEBHOOK_URL")
ALERT_WEBHOOK_SECRET = env_str("ALERT_WEBHOOK_SECRET") or (None if PRODUCTION else "alert-dev-secret")
if ALERT_WEBHOOK_URL and not ALERT_WEBHOOK_SECRET:
    # A public development secret would let anyone forge alerts to the receiver.
    raise RuntimeError("ALERT_WEBHOOK_SECRET must be set with ALERT_WEBHOOK_URL in production")
ALERT_EMAILS = env_list("ALERT_EMAILS", "operations@surety.example")
# An alert's e-mail to a person who may decide its review item carries a link of their own,
# single-use, for this many seconds (approvals.links): 4 hours, a review's default deadline.
DECISION_LINK_SECONDS = env_int("DECISION_LINK_SECONDS", 4 * 3600)
# Monitoring (ledger.metrics). /metrics opens to a bearer METRICS_TOKEN or a client address in
# METRICS_ALLOWED_IPS (addresses or networks); with neither it is open on loopback outside
# production and closed in production. Entries are checked here, so a typo stops the start.
METRICS_TOKEN = env_str("METRICS_TOKEN")
METRICS_ALLOWED_IPS = [str(ipaddress.ip_network(entry, strict=False)) for entry in env_list("METRICS_ALLOWED_IPS")]
# Actions pending or unknown for longer than this are counted apart (surety_actions_stale).
METRICS_STALE_SECONDS = env_float("METRICS_STALE_SECONDS", 300)
# /healthz: how recent a worker's heartbeat (RQ's worker TTL 420 s + its 60 s grace, by
# default: an idle worker beats every TTL - 15 s) and the sweeper's last pass must be.
HEALTHZ_WORKER_SECONDS = env_float("HEALTHZ_WORKER_SECONDS", 480)
HEALTHZ_SWEEPER_SECONDS = env_float("HEALTHZ_SWEEPER_SECONDS", max(60, 3 * SWEEP_INTERVAL_SECONDS))
# An action type with limits in some currencies, asked for an amount in another (approvals.intake.rule_for):
# "approve" makes it wait for a person, as above a limit; "refuse" refuses it at intake (422
# currency_not_covered, nothing recorded). A type without any limit runs unlimited either way.
LIMITS_UNCOVERED_CURRENCY = env_str("LIMITS_UNCOVERED_CURRENCY", "approve").strip().lower()
if LIMITS_UNCOVERED_CURRENCY not in {"approve", "refuse"}:
    raise RuntimeError("LIMITS_UNCOVERED_CURRENCY must be approve or refuse")

# --- Auth: sign-in, the second factor, step-up (docs/signin.md) ----------------------------
AUTHENTICATION_BACKENDS = [
    "allauth.account.auth_backends.AuthenticationBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None
GUARDIAN_MONKEY_PATCH_USER = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"
# The company's OpenID Connect provider. A person signs in through it only if they already exist
# here, found by the e-mail address the provider vouches for (console.signin): nobody is created.
OIDC_ISSUER = env_str("OIDC_ISSUER", "")
OIDC_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_NAME = env_str("OIDC_NAME", "your company's sign-in")
if OIDC_ISSUER and not (OIDC_CLIENT_ID and OIDC_CLIENT_SECRET):
    raise RuntimeError("OIDC_ISSUER needs OIDC_CLIENT_ID and OIDC_CLIENT_SECRET")
SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"OAUTH_PKCE_ENABLED": True, "APPS": [{
    "provider_id": "company", "name": OIDC_NAME, "client_id": OIDC_CLIENT_ID, "secret": OIDC_CLIENT_SECRET,
    "settings": {"server_url": OIDC_ISSUER},
}] if OIDC_ISSUER else []}}
# Local password accounts (the demo people's): off, the company's provider is the only way in.
PASSWORD_SIGN_IN = env_bool("PASSWORD_SIGN_IN", True)
SOCIALACCOUNT_ONLY = not PASSWORD_SIGN_IN
if SOCIALACCOUNT_ONLY and not OIDC_ISSUER:
    raise RuntimeError("PASSWORD_SIGN_IN=false needs OIDC_ISSUER: nobody could sign in")
ACCOUNT_ADAPTER = "console.signin.AccountAdapter"
SOCIALACCOUNT_ADAPTER = "console.signin.SocialAccountAdapter"
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "password1*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_SESSION_REMEMBER = False
ACCOUNT_LOGOUT_REDIRECT_URL = LOGOUT_REDIRECT_URL
# Failed sign-ins: per client address and per username (allauth's rate limits, kept in the cache).
ACCOUNT_RATE_LIMITS = {"login_failed": env_str("SIGN_IN_FAILURE_LIMIT", "10/m/ip,5/5m/key")}
# The client's address for those limits (and allauth's 30 sign-ins a minute per address): behind
# the load balancer production assumes (SECURE_PROXY_SSL_HEADER), the last entry of
# X-Forwarded-For that the trusted proxies added; else every person shares the balancer's
# address, and ten wrong passwords a minute from anyone lock everyone out.
ALLAUTH_TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 1 if PRODUCTION else 0)
# Every person who can decide money or authority (approvers, operators, admins) has a second
# factor: without one, every page sends them to enrol one first.
MFA_REQUIRED = env_bool("MFA_REQUIRED", not DEBUG)
MFA_SUPPORTED_TYPES = ["totp", "webauthn", "recovery_codes"]
MFA_TOTP_ISSUER = "Surety"
# A passkey's answer that cannot be parsed is a wrong passkey, never a 500 (console.mfa_forms).
MFA_FORMS = {
    "authenticate_webauthn": "console.mfa_forms.AuthenticateWebAuthnForm",
    "reauthenticate_webauthn": "console.mfa_forms.ReauthenticateWebAuthnForm",
    "add_webauthn": "console.mfa_forms.AddWebAuthnForm",
}
# WebAuthn over plain HTTP (a browser allows it for localhost only): development and tests.
MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = DEBUG
# A money decision needs a second factor given within this many seconds (0: no step-up).
STEP_UP_SECONDS = env_float("STEP_UP_SECONDS", 0 if DEBUG else 300)
ACCOUNT_REAUTHENTICATION_TIMEOUT = STEP_UP_SECONDS or 300
# What confirms it is still the same person (a step-up, changing one's factors): the second
# factor only, never the password it stands beside.
ACCOUNT_REAUTHENTICATION_METHODS = ["mfa"]
# A session lasts this long from sign-in, and ends when the browser closes.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
# The cache the sign-in rate limits count in: a table of the database (console migration 0001),
# shared by every web process and host, so a Redis that is down or hung (Redis only delivers work)
# neither stops people signing in nor lets the throttle be counted per process.
# It holds allauth's sign-in rate limits and the authenticator codes already used. Django's database
# cache keeps 300 rows by default and, past them, deletes a third whatever they hold: a run of
# failed sign-ins under made-up names would wipe a person's count of failures, or let a used code
# be taken again. Rows live minutes; a set counts the table (its cull check), so not unbounded.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "console_cache",
                      "OPTIONS": {"MAX_ENTRIES": 100_000}}}

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ledger.api.auth.AgentTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["ledger.api.auth.IsAgent"],
    "DEFAULT_PARSER_CLASSES": ["ledger.api.problems.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "ledger.api.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["ledger.api.auth.AgentRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"agent": env_str("API_RATE_LIMIT", "20000/min")},
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Surety agents' API",
    "DESCRIPTION": "Guarded, idempotent actions and durable tasks for AI agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # The components' names are part of what generated clients rely on: the per-type request
    # schemas must not rename the two enums the document always had.
    "ENUM_NAME_OVERRIDES": {"ActionTypeEnum": "ledger.models.ActionType", "StatusEnum": "ledger.models.ActionStatus"},
}
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# --- Static files ---------------------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static", ("vendor/htmx", BASE_DIR / "node_modules" / "htmx.org" / "dist")]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# --- Security -------------------------------------------------------------------------------
# The sign-in page's "Sign in with OIDC_NAME" is a form posted here, which allauth answers with a
# redirect to the provider's authorization endpoint (at the issuer's origin). Browsers hold the
# redirects a form submission follows to form-action too (Chromium refuses one to an origin it does
# not name), so that origin is named there; the provider's pages are top-level navigations under
# their own policy, and no other directive names it (docs/signin.md).
_issuer = urlsplit(OIDC_ISSUER)
_OIDC_ORIGINS = [f"{_issuer.scheme}://{_issuer.netloc.rpartition('@')[2]}"] if _issuer.netloc else []
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'", *_OIDC_ORIGINS],
        "base-uri": ["'self'"],
    }
}
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# --- Mail -----------------------------------------------------------------------------------
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "surety@surety.example")
# The SMTP server, for EMAIL_BACKEND django.core.mail.backends.smtp.EmailBackend.
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
# An alert is mailed under its row lock: a mail server that hangs must not hold it for good.
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"surety": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")}},
}
