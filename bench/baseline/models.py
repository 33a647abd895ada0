from django.db import models
from django.utils import timezone


class BaselineRow(models.Model):
    """One row per key: what a bare Django view writes and reads, for comparison."""

    key = models.CharField(max_length=255, unique=True)
    payload = models.JSONField()
    status = models.CharField(max_length=20, default="new")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.key
