"""The actions that name no customer share one daily total (approvals.intake.verdict_for_request,
decision 30): every day summarised before counted 0 before each of them, so every summary is
made stale once, to be made again by the sweeper (approvals.summaries). Backward nothing is
undone: a stale mark only costs a summary made again."""

from django.db import migrations


def every_summary_stale(apps, schema_editor):
    apps.get_model("approvals", "SummaryDay").objects.filter(stale=False).update(stale=True)


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0018_a_days_summary_follows_a_failures_retry"),
    ]

    operations = [migrations.RunPython(every_summary_stale, migrations.RunPython.noop)]
