"""A signed event nested deep: POST /webhooks/sandbox/ stores it and settles its action (its parser
takes some hundreds of levels), and the action's pages, which show the event's data as the
action's result and evidence, must still be readable by the people who decide on it. They answered
500 from some 80 levels (components/_data.html included itself once a level): they show 12 levels
as lists and what lies deeper as its JSON text."""

import json
import re

import pytest
from django.urls import reverse

from ledger.json_input import DEEPER
from ledger.models import Action, ActionStatus, AuditEvent
from tests.factories import make_action, make_agent, person
from tests.ledger.test_webhooks import KEY, deliver, webhook_secret  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db
S = ActionStatus


def nested_event(depth, bottom=""):
    inner = "[" * depth + bottom + "]" * depth
    return (f'{{"id": "evt_deep", "type": "refund.succeeded", "data": {{"id": "re_w1", "lines": {inner}, '
            f'"metadata": {{"operation_key": "{KEY}"}}}}}}').encode()


def test_the_pages_of_an_action_a_deeply_nested_event_settled_are_readable(client):
    action = make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1,
                         fence=2)
    assert deliver(client, nested_event(200)).status_code == 200
    assert Action.objects.get(pk=action.pk).status == S.SUCCEEDED
    AuditEvent.objects.seal()
    client.force_login(person("aldo", "auditors"))
    client.raise_request_exception = False

    for page in ("action-detail", "action-evidence", "action-evidence-json"):
        assert client.get(reverse(page, args=[action.pk])).status_code == 200, page


def nested(depth, bottom):
    value = bottom
    for _ in range(depth):
        value = [value]
    return value


def shown_deeper(page):
    """The JSON text a page shows of what lies deeper than its lists, each balanced and escaped."""
    texts = re.findall(r'<pre class="dump">(\[+)&quot;&lt;b&gt;bottom&lt;/b&gt;&quot;(\]+)</pre>', page)
    assert texts and all(len(opened) == len(closed) for opened, closed in texts)
    assert "<b>bottom" not in page
    return texts


def test_the_pages_show_an_event_60_levels_deep_as_lists_then_its_json_text(client):
    action = make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1,
                         fence=2)
    assert deliver(client, nested_event(60, '"<b>bottom</b>"')).status_code == 200
    AuditEvent.objects.seal()
    client.force_login(person("aldo", "auditors"))

    detail = client.get(reverse("action-detail", args=[action.pk])).content.decode()
    # The result (the event's data) is the first of the 12 levels shown as lists, its "lines" the
    # next 11; the rest is JSON text.
    assert min(len(opened) for opened, _ in shown_deeper(detail)) == 60 - 11
    shown_deeper(client.get(reverse("action-evidence", args=[action.pk])).content.decode())


def test_an_event_nested_past_what_is_kept_is_stored_cut_and_settles(client):
    """Its store ran out of stack from some 880 levels, and the delivery answered 500, which the
    provider would send again for days: it is kept to DEPTH_KEPT levels, as an answer is."""
    action = make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1,
                         fence=2)
    assert deliver(client, nested_event(880)).status_code == 200

    settled = Action.objects.get(pk=action.pk)
    assert settled.status == S.SUCCEEDED
    assert DEEPER in json.dumps(settled.result)


def test_data_kept_800_levels_deep_before_is_shown(client):
    """As deep as an event was stored (the pages read what the webhook's parser took)."""
    action = make_action(make_agent("billing", grants=())[0], S.SUCCEEDED, key=KEY, target="ORD-W1", attempts=1,
                         fence=2)
    deep = nested(800, "<b>bottom</b>")
    Action.objects.filter(pk=action.pk).update(result={"lines": deep}, evidence=[{"data": {"lines": deep}}])
    AuditEvent.objects.seal()
    client.force_login(person("aldo", "auditors"))

    for page in ("action-detail", "action-evidence"):
        shown_deeper(client.get(reverse(page, args=[action.pk])).content.decode())
    assert client.get(reverse("action-evidence-json", args=[action.pk])).json()["outcome"]["result"]["lines"] == deep
