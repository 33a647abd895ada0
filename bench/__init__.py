"""`python -m bench`: throughput of the ledger's hot paths next to bare-Django baselines.

See `bench/__main__.py` for what is measured and how.
"""
