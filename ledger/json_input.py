"""JSON from outside, parsed into what PostgreSQL can store (or refused), or mended to fit.

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
    for value in _values(data):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("not a finite number")
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError("NUL in a string")
            if not value.isascii():
                value.encode()  # UnicodeEncodeError (a ValueError) for a lone surrogate
    return data


def lone_surrogate(data):
    """Whether a string or a key in parsed JSON `data` holds a lone surrogate ("\\ud800"): JSON's
    escapes can name one, no UTF-8 text can carry it, so an answer that names it back (an
    unknown field, a choice that is none) could not be encoded."""
    return any(isinstance(value, str) and not value.isascii() and any(ord(c) in SURROGATES for c in value)
               for value in _values(data))


def _values(data):
    """Every value in parsed JSON `data`, the objects' keys included, containers before what they
    hold: a loop, not recursion, as the nesting may be as deep as json.loads allows."""
    pending = [data]
    while pending:
        value = pending.pop()
        yield value
        if isinstance(value, dict):
            pending.extend(value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)


SURROGATES = range(0xD800, 0xE000)


def storable(value):
    """`value`, parsed from a provider's answer, with what PostgreSQL cannot store replaced: a
    NUL or a lone surrogate in a string (or a key) by U+FFFD, a number that is not finite by its
    text. Not refused, as a request is: the answer tells of an effect that may already be made,
    and it must be recorded, as near to what came as the columns allow."""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        if not value.isascii() and any(ord(c) in SURROGATES for c in value):
            value = "".join("\ufffd" if ord(c) in SURROGATES else c for c in value)
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value
