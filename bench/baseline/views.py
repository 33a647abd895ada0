"""Two bare Django views on the product's database: the floor the API is measured against.

- insert: parse a JSON body, INSERT a row (commit 1), UPDATE it (commit 2), answer JSON —
  the shape of the ledger's write path (a row, then a second write) without its logic.
- read: SELECT one row by its unique key, answer JSON — the shape of a replayed request.
"""

import json

from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .models import BaselineRow


def _body(row):
    return {"key": row.key, "payload": row.payload, "status": row.status,
            "created_at": row.created_at.isoformat(), "updated_at": row.updated_at.isoformat()}


@csrf_exempt
@require_POST
def baseline_insert(request):
    data = json.loads(request.body)
    row = BaselineRow.objects.create(key=data["key"], payload=data.get("payload") or {})
    row.status, row.updated_at = "written", timezone.now()
    row.save(update_fields=["status", "updated_at"])
    return JsonResponse(_body(row), status=201)


@require_GET
def baseline_read(request, key):
    row = BaselineRow.objects.filter(key=key).first()
    if row is None:
        return JsonResponse({"error": "not found"}, status=404)
    return JsonResponse(_body(row))
