"""The cache table the sign-in rate limits count in (CACHES in config.settings): Django's
database cache, created by its own command so its layout is Django's."""

from django.core.management import call_command
from django.db import migrations


def create(apps, schema_editor):
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


def drop(apps, schema_editor):
    schema_editor.execute(f"DROP TABLE IF EXISTS {schema_editor.quote_name('console_cache')}")


class Migration(migrations.Migration):
    dependencies = []
    operations = [migrations.RunPython(create, drop)]
