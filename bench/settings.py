"""The settings every benchmarked process runs with: the product's own, plus the baseline app.

The API under test and the bare-Django baseline views are served by the same gunicorn, with
the same middleware, database connection settings and environment, so their figures compare.
"""

import os

from config.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.baseline"]  # noqa: F405
ROOT_URLCONF = "bench.urls"

# Django's psycopg pool instead of persistent connections, for `python -m bench health_checks`
# only (BENCH_DATABASE_POOL: the connections each process may hold, one per thread). Django
# checks each connection the pool hands out when CONN_HEALTH_CHECKS is on.
if os.environ.get("BENCH_DATABASE_POOL"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
    DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": 2, "max_size": int(os.environ["BENCH_DATABASE_POOL"])}  # noqa: F405
