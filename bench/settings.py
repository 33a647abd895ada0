"""The settings every benchmarked process runs with: the product's own, plus the baseline app.

The API under test and the bare-Django baseline views are served by the same gunicorn, with
the same middleware, database connection settings and environment, so their figures compare.
"""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.baseline"]  # noqa: F405
ROOT_URLCONF = "bench.urls"
