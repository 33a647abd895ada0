"""`python -m bench`: throughput of the ledger's hot paths next to bare-Django baselines.

See `bench/__main__.py` for what is measured and how.
"""

import os

# Every benchmarked process runs with DEBUG off, as production does (DEBUG on would record every
# query and skew the figures), and config.settings then gives no development key or hosts. Each of
# the bench's processes (`python -m bench`, `python -m bench.<module>`) imports this package first and
# passes its environment on to the servers, workers and children it starts: they all sign with this
# bench-only key and answer on the loopback addresses, unless the environment sets its own.
os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-never-used-outside-the-benchmarks-9d2e4a61")
os.environ.setdefault("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
