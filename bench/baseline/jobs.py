def nothing():
    """What the two-commits-plus-one-enqueue baseline enqueues; never run by the benchmark."""
