"""Incidents, the reconciliation runs that open them, and their alerts."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0005_limit_rules_held_by_the_database'),
        ('dlq', '0006_one_delivery_per_attempt'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Incident',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('kind', models.CharField(choices=[('orphan_effect', 'effect without a ledger entry'), ('double_effect', 'more than one effect for an operation key'), ('amount_mismatch', 'amount differs from the ledger')], max_length=30)),
                ('connector', models.CharField(max_length=50)),
                ('action_type', models.CharField(blank=True, default='', max_length=40)),
                ('operation_key', models.CharField(blank=True, default='', max_length=255)),
                ('subject', models.CharField(max_length=255)),
                ('external_refs', models.JSONField(default=list)),
                ('evidence', models.JSONField(default=dict)),
                ('status', models.CharField(choices=[('open', 'Open'), ('resolved', 'Resolved')], default='open', max_length=20)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('resolved_by', models.CharField(blank=True, default='', max_length=150)),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
                ('resolution', models.TextField(blank=True, default='')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='ReconciliationRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('since', models.DateTimeField()),
                ('until', models.DateTimeField(unique=True)),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('complete', models.BooleanField(default=False)),
                ('report', models.JSONField(default=dict)),
            ],
            options={
                'ordering': ['-until'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='alert',
            name='alert_names_its_subject',
        ),
        migrations.AlterField(
            model_name='alert',
            name='kind',
            field=models.CharField(choices=[('dead_letter', 'Dead Letter'), ('overdue_review', 'Overdue Review'), ('incident', 'Incident')], max_length=30),
        ),
        migrations.AddField(
            model_name='incident',
            name='owner',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='incidents', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='alert',
            name='incident',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='alerts', to='dlq.incident'),
        ),
        migrations.AddConstraint(
            model_name='alert',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('dead_letter__isnull', False), ('incident__isnull', True), ('kind', 'dead_letter'), ('review_item__isnull', True)), models.Q(('dead_letter__isnull', True), ('incident__isnull', True), ('kind', 'overdue_review'), ('review_item__isnull', False)), models.Q(('dead_letter__isnull', True), ('incident__isnull', False), ('kind', 'incident'), ('review_item__isnull', True)), _connector='OR'), name='alert_names_its_subject'),
        ),
        migrations.AddConstraint(
            model_name='reconciliationrun',
            constraint=models.CheckConstraint(condition=models.Q(('until__gt', models.F('since'))), name='reconciliationrun_window'),
        ),
        migrations.AddIndex(
            model_name='incident',
            index=models.Index(fields=['status', '-created_at', '-id'], name='incident_queue_idx'),
        ),
        migrations.AddConstraint(
            model_name='incident',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['open', 'resolved'])), name='incident_status_valid'),
        ),
        migrations.AddConstraint(
            model_name='incident',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['orphan_effect', 'double_effect', 'amount_mismatch'])), name='incident_kind_valid'),
        ),
        migrations.AddConstraint(
            model_name='incident',
            constraint=models.UniqueConstraint(fields=('connector', 'kind', 'subject'), name='incident_once_per_finding'),
        ),
        migrations.AddConstraint(
            model_name='incident',
            constraint=models.CheckConstraint(condition=models.Q(('status', 'open'), models.Q(('resolution', ''), _negated=True), _connector='OR'), name='incident_resolved_has_reason'),
        ),
    ]
