"""Where a bench case's figures go: one JSON file per case, under artifacts/ by default."""

import json
from datetime import UTC, datetime
from pathlib import Path


def write_results(out, document):
    """`document` as indented JSON at `out` (its folder made first), stamped with when it was
    written (UTC) unless it says itself; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": datetime.now(UTC).isoformat(), **document}, indent=2, default=str) + "\n")
    return out
