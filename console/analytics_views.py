"""The decision analytics page: figures from approvals.analytics, drawn as small SVG charts.

The charts are plain SVG written by the template from the geometry computed here: no
JavaScript, no inline style (the CSP allows neither), colours from the stylesheet's classes.
"""

from django.shortcuts import render

from approvals.analytics import decision_analytics as figures
from approvals.models import ReviewKind

from .dashboard import staff_required

TREND_WIDTH, TREND_HEIGHT = 600, 120
BAR_WIDTH = 120  # the small bars in the tables' rows
SEGMENTS = ("approved", "rejected", "other")


def duration(value):
    """A timedelta as a person reads it: "45 s", "12 min", "3.5 h", "2.1 d"; "—" for none."""
    if value is None:
        return "—"
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size * (1.5 if unit == "d" else 1):
            amount = seconds / size
            return f"{amount:.1f} {unit}" if amount < 10 and unit != "min" else f"{amount:.0f} {unit}"
    return f"{seconds:.0f} s"


def _times(groups, labels=None):
    """Table rows of a times-to-decision figure, each with its two bars (median, p90) scaled
    to the slowest p90 on the table."""
    longest = max((row["p90"].total_seconds() for row in groups.values()), default=0) or 1
    return [{"name": (labels or {}).get(name, name), "n": row["n"], "median": duration(row["median"]),
             "p90": duration(row["p90"]),
             "median_w": round(BAR_WIDTH * row["median"].total_seconds() / longest, 1),
             "p90_w": round(BAR_WIDTH * row["p90"].total_seconds() / longest, 1)} for name, row in groups.items()]


def _rates(groups):
    """Table rows of a rates figure, each with a stacked bar: approved, rejected, other."""
    rows = []
    for name, row in groups.items():
        other = row["n"] - row["approved"] - row["rejected"]
        x, segments = 0.0, []
        for segment, n in zip(SEGMENTS, (row["approved"], row["rejected"], other), strict=True):
            width = BAR_WIDTH * n / row["n"]
            segments.append({"kind": segment, "x": round(x, 1), "w": round(width, 1)})
            x += width
        rows.append({"name": name, "n": row["n"], "approval_rate": row["approval_rate"],
                     "rejection_rate": row["rejection_rate"], "segments": segments})
    return rows


def _trend(days):
    """The 30-day charts: stacked bars of decisions per day, and the median time per day as
    dots joined by a line (days without a decision leave a gap)."""
    slot = TREND_WIDTH / len(days)
    most = max((day["n"] for day in days), default=0) or 1
    slowest = max((day["median"].total_seconds() for day in days if day["median"] is not None), default=0) or 1
    bars, points = [], []
    for i, day in enumerate(days):
        y = TREND_HEIGHT
        segments = []
        for segment in SEGMENTS:
            height = TREND_HEIGHT * day[segment] / most
            y -= height
            if height:
                segments.append({"kind": segment, "y": round(y, 1), "h": round(height, 1)})
        bars.append({"x": round(i * slot + 1, 1), "w": round(slot - 2, 1), "segments": segments, "day": day})
        if day["median"] is not None:
            points.append({"x": round(i * slot + slot / 2, 1),
                           "y": round(TREND_HEIGHT - TREND_HEIGHT * day["median"].total_seconds() / slowest, 1),
                           "day": day["day"], "median": duration(day["median"])})
    return {"bars": bars, "points": points, "line": " ".join(f"{p['x']},{p['y']}" for p in points),
            "most": most, "slowest": duration(max((d["median"] for d in days if d["median"] is not None),
                                                   default=None)),
            "first": days[0]["day"], "last": days[-1]["day"]}


@staff_required
def decision_analytics(request):
    """Staff only; auditors read it as everyone else does (it changes nothing)."""
    data = figures()
    kinds = dict(ReviewKind.choices)
    overdue = [{"kind": kinds[kind], **row, "rate_w": round(BAR_WIDTH * (row["rate"] or 0), 1)}
               for kind, row in data["overdue"].items()]
    context = {
        **data, "width": TREND_WIDTH, "height": TREND_HEIGHT, "bar_width": BAR_WIDTH,
        "per_queue": _times(data["per_queue"], kinds), "per_approver": _times(data["per_approver"]),
        "overdue": overdue, "per_action_type": _rates(data["per_action_type"]),
        "per_agent": _rates(data["per_agent"]), "chart": _trend(data["trend"]),
        "decided": sum(day["n"] for day in data["trend"]),
    }
    return render(request, "approvals/analytics.html", context)
