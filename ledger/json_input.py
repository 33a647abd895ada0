"""JSON from outside, parsed into what PostgreSQL can store.

`json.loads` accepts NaN, Infinity, 1e400 (a float infinity), "\\u0000" and a lone surrogate
("\\ud800"); jsonb and text columns refuse them, and a lone surrogate cannot even be encoded to
hash it, so a body carrying one would fail at the INSERT (or the hash) as a 500.
"""

import json
import math


def loads_storable(raw):
    """Parse `raw` (bytes or str); ValueError for anything that is not storable JSON."""
    try:
        data = json.loads(raw)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc
    pending = [data]
    while pending:  # a loop, not recursion: the nesting may be as deep as json.loads allows
        value = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("not a finite number")
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError("NUL in a string")
            if not value.isascii():
                value.encode()  # UnicodeEncodeError (a ValueError) for a lone surrogate
        if isinstance(value, dict):
            pending.extend(value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return data
