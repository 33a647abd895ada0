"""`storable` keeps a provider's answer as near to what came as the columns allow, however deep
`json.loads` took it (some 990 levels): it walks the answer in a loop (recursing, it failed from
about 490 levels) and keeps DEPTH_KEPT levels, an object or array deeper marked DEEPER, as what
writes a JSON column, json.dumps, recurses too."""

import json

import pytest

from ledger.json_input import DEEPER, DEPTH_KEPT, storable


def nested(depth, bottom="bottom"):
    """`depth` levels, objects and arrays in turn from the top, `bottom` in the last."""
    value = bottom
    for level in range(depth, 0, -1):
        value = [value] if level % 2 else {"a": value}
    return value


@pytest.mark.parametrize("depth", [DEPTH_KEPT + 1, 489, 490, 600, 990])
def test_an_answer_nested_deeper_than_kept_is_cut_to_the_mark(depth):
    kept = storable(nested(depth))

    assert kept == nested(DEPTH_KEPT, bottom=DEEPER)
    json.dumps(kept)  # what the column's writer does


@pytest.mark.parametrize("depth", [1, DEPTH_KEPT - 1, DEPTH_KEPT])
def test_an_answer_as_deep_as_kept_is_kept_whole(depth):
    assert storable(nested(depth)) == nested(depth)


def test_a_wide_shallow_answer_is_kept_as_it_came():
    answer = {"id": "re_1", "lines": [{"sku": f"S-{n}", "qty": n, "price": n / 4, "tags": ["a", None, True]}
                                      for n in range(5000)], "meta": {str(n): n for n in range(5000)}}

    assert storable(answer) == answer
    assert list(storable(answer)["meta"]) == list(answer["meta"])  # in its order


def test_what_is_mended_is_mended_at_any_depth_kept():
    answer = nested(DEPTH_KEPT - 2, bottom={"not\x00": [float("inf"), "a\ud800b", ("t",)]})

    assert storable(answer) == nested(DEPTH_KEPT - 2, bottom={"not\ufffd": ["inf", "a\ufffdb", DEEPER]})
