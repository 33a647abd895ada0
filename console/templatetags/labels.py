"""How the dashboard names things for people: "awaiting approval", not `awaiting_approval`."""

from django import template
from django.utils.dateparse import parse_datetime

register = template.Library()


@register.filter
def human(value):
    """A status, kind or verb as words: underscores become spaces; anything else as it is."""
    return str(value).replace("_", " ") if isinstance(value, str) else value


@register.filter
def moment(value):
    """An ISO 8601 time kept as text (evidence, audit data) as a datetime, for components/_time.html."""
    if not isinstance(value, str):
        return value
    try:
        return parse_datetime(value)
    except ValueError:  # well-formed but impossible ("2026-13-45T99:99")
        return None
