"""Structured data (JSON) for components/_data.html, past the depth it shows as lists."""

import json

from django import template

register = template.Library()


class _Written(str):
    """JSON text already written, among the values still to write."""


@register.filter
def json_text(value):
    """`value` as JSON text on one line, written by a loop: json.dumps recurses, a frame a level,
    and data kept from outside may be nested as deep as json.loads took it (some hundreds of
    levels), below a page's own frames."""
    written, pending = [], [value]
    while pending:
        value = pending.pop()
        if isinstance(value, _Written):
            written.append(value)
        elif isinstance(value, dict | list | tuple):
            is_object = isinstance(value, dict)
            written.append("{" if is_object else "[")
            pending.append(_Written("}" if is_object else "]"))
            then = []  # what follows the bracket, in order, separators written
            for i, (key, item) in enumerate(value.items() if is_object else enumerate(value)):
                then.append(_Written((", " if i else "") + (_scalar(str(key)) + ": " if is_object else "")))
                then.append(item)
            pending.extend(reversed(then))
        else:
            written.append(_scalar(value))
    return "".join(written)


def _scalar(value):
    return json.dumps(value, ensure_ascii=False, default=str)
