"""The chain's intact checks indexed by how far they reached (ledger.audit.ChainCheck): every sweeper
pass asks for the one that reached furthest (furthest_intact_check), where its newest check starts,
and without an index it read and sorted every intact check kept (up to one a second until the
archive takes them). The index is partial, as the question is: a broken check is never its answer."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0052_done_by_hand_keeps_retryable_false_and_tasks_too'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='chaincheck',
            index=models.Index(condition=models.Q(('broken_at__isnull', True)), fields=['through_seq', 'id'], name='chaincheck_intact_idx'),
        ),
    ]
