"""Every list page's filters, as forms bound to the query string.

A filter a page cannot read is dropped, as if it had not been given: a bookmarked or hand-edited
query string shows the list (unfiltered where its value made no sense), never an error page. The
fields shared by several pages (a status, a kind, search text, a date range, the keyset cursor,
a page number) are declared here once.
"""

from django import forms

from approvals.models import ReviewStatus
from dlq.incidents import IncidentStatus
from dlq.models import EntryStatus
from ledger.models import ActionStatus
from ledger.validation import parse_moment


class TextField(forms.CharField):
    """Search text, stripped; "" when absent."""

    def __init__(self, **kwargs):
        super().__init__(required=False, **kwargs)


class StatusField(forms.ChoiceField):
    """One of `statuses`; "all" (or "") is "" and filters nothing; `default` when the query
    string names none."""

    def __init__(self, statuses, default=""):
        self.default = default
        super().__init__(required=False, choices=[(s, s) for s in [*statuses, "all"]])

    def to_python(self, value):
        return self.default if value is None else super().to_python(value)

    def clean(self, value):
        value = super().clean(value)
        return "" if value == "all" else value


class MomentField(forms.Field):
    """A date-time bound of a range (ISO 8601 or a datetime-local input's): None when absent or
    unreadable, see ledger.validation.parse_moment."""

    def __init__(self):
        super().__init__(required=False)

    def to_python(self, value):
        return parse_moment(value)


class Filters(forms.Form):
    """The keyset cursor every list pages with (a mangled one shows the first page)."""

    after = TextField()

    def values(self):
        """Each filter's cleaned value; None for one that was invalid (dropped)."""
        self.is_valid()
        return {name: self.cleaned_data.get(name) for name in self.fields}

    def echo(self):
        """The query string as given, without the cursor: the next page's link and the
        filters' inputs repeat it."""
        filters = self.data.copy()
        filters.pop("after", None)
        return filters


class ReviewQueueFilters(Filters):
    status = StatusField(ReviewStatus.values, default=ReviewStatus.OPEN)
    kind = forms.ChoiceField(required=False)
    action_type = TextField()

    def __init__(self, params, *, kinds):
        super().__init__(params)
        self.fields["kind"].choices = [("", ""), *((k, k) for k in kinds)]


class DeadLetterFilters(Filters):
    status = StatusField(EntryStatus.values, default=EntryStatus.OPEN)
    workflow = TextField()
    code = TextField()


class IncidentFilters(Filters):
    status = StatusField(IncidentStatus.values, default=IncidentStatus.OPEN)
    kind = TextField()
    connector = TextField()


class ActionSearchFilters(Filters):
    key = TextField()
    target = TextField()
    customer = TextField()
    agent = TextField()
    status = StatusField(ActionStatus.values)
    since = MomentField()
    until = MomentField()


class AuditFilters(Filters):
    actor = TextField()
    verb = TextField()
    object_type = TextField()
    object_id = TextField()
    since = MomentField()
    format = TextField()


class PageFilters(Filters):
    """A numbered page: the first for one that is not a number (Paginator.get_page shows the
    last for one past the end)."""

    page = forms.IntegerField(required=False, min_value=1)
