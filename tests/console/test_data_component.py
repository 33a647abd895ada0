"""components/_data.html shows structured data as nested lists down to 12 levels and what lies
deeper as its JSON text, escaped: it includes itself once a level, and data kept from outside may be
nested as deep as json.loads took it; the pages showing it answered 500 from some 80 levels."""

import json

import pytest
from django.template.loader import render_to_string
from django.utils.html import escape

from console.templatetags.data import json_text


def nested(depth, bottom):
    """`depth` levels, objects and arrays in turn from the top, `bottom` in the last."""
    value = bottom
    for level in range(depth, 0, -1):
        value = [value] if level % 2 else {"k": value}
    return value


def shown(value):
    return render_to_string("components/_data.html", {"value": value})


@pytest.mark.parametrize("depth", [13, 100, 900, 5000])
def test_data_deeper_than_12_levels_is_shown_as_lists_then_its_json_text(depth):
    page = shown(nested(depth, "<b>\"bottom\"</b>"))

    assert page.count('<ol class="data-list">') + page.count('<dl class="data">') == 12
    dumped = page.split('<pre class="dump">')[1].split("</pre>")[0]
    assert dumped == escape(json_text(nested(depth - 12, "<b>\"bottom\"</b>")))
    assert page.count('<pre class="dump">') == 1 and "<b>" not in page


def test_data_12_levels_deep_is_all_lists():
    page = shown(nested(12, "bottom"))

    assert page.count('<ol class="data-list">') + page.count('<dl class="data">') == 12
    assert "dump" not in page and '<span class="mono">bottom</span>' in page


def test_deeper_levels_are_counted_down_each_branch():
    page = shown({"shallow": nested(3, 1), "deep": nested(20, 1), "list": [nested(10, 2), nested(11, 3)]})

    assert page.count('<pre class="dump">') == 2  # "deep" from its 12th level, the list's second item at its 11th
    assert '<pre class="dump">[3]</pre>' in page


def test_json_text_is_what_json_dumps_writes():
    value = {"a": [1, 2.5, None, True, False, "é\"\\", {}, [], {"": [{"x": -0.0}]}], "n": {"1": "2"}}

    assert json_text(value) == json.dumps(value, ensure_ascii=False)
    assert json_text(nested(5000, 0)) == "".join("[" if level % 2 else '{"k": ' for level in range(1, 5001)) + \
        "0" + "".join("]" if level % 2 else "}" for level in range(5000, 0, -1))
