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
# How deep `storable` keeps an answer: a provider's answers are a few levels deep, and what writes
# a JSON column (json.dumps) recurses, a frame a level, as do the pages that show it.
DEPTH_KEPT = 64
DEEPER = f"<nested deeper than {DEPTH_KEPT} levels: not kept>"


def storable(value, depth=DEPTH_KEPT):
    """`value`, parsed from a provider's answer, with what PostgreSQL cannot store replaced: a
    NUL or a lone surrogate in a string (or a key) by U+FFFD, a number that is not finite by its
    text, an object or array nested deeper than DEPTH_KEPT levels by DEEPER. Not refused, as a
    request is: the answer tells of an effect that may already be made, and it must be recorded,
    as near to what came as the columns allow. Recursive, a frame a level to DEPTH_KEPT at most
    (far below the interpreter's limit, which json.loads reaches near 1,000): a loop cost the
    settle's values three times the CPU."""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        if not value.isascii() and any(ord(c) in SURROGATES for c in value):
            value = "".join("\ufffd" if ord(c) in SURROGATES else c for c in value)
        return value
    if isinstance(value, dict):
        return {storable(k): storable(v, depth - 1) for k, v in value.items()} if depth else DEEPER
    if isinstance(value, list | tuple):
        return [storable(v, depth - 1) for v in value] if depth else DEEPER
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
