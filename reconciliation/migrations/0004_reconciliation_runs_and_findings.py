"""Reconcilers' records: ReconciliationRun and Finding (one open finding per kind and object)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('intake', '0008_copied_messages'),
        ('reconciliation', '0003_routing_role_permissions'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReconciliationRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(max_length=30)),
                ('scope', models.CharField(max_length=200)),
                ('started_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('scanned', models.PositiveIntegerField(default=0)),
                ('findings', models.PositiveIntegerField(default=0)),
                ('repaired', models.PositiveIntegerField(default=0)),
                ('error', models.TextField(blank=True)),
                ('cursor', models.JSONField(blank=True, default=dict)),
            ],
            options={
                'default_permissions': ('view',),
                'indexes': [models.Index(fields=['kind', 'scope', '-started_at'], name='reconciliation_run_latest'), models.Index(fields=['scope', '-started_at'], name='reconciliation_run_scope'), models.Index(fields=['started_at'], name='reconciliation_run_started')],
            },
        ),
        migrations.CreateModel(
            name='Finding',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('missing_from_inbox', 'The provider has a message we never stored'), ('unmapped', "An open event has no ticket mapping past the tenant's threshold"), ('orphan_in_destination', 'A destination record carries our reference, no mapping'), ('ticket_missing', "A mapping's ticket no longer exists in the destination"), ('outbox_stuck', 'An outbox row stayed unpublished past the threshold')], max_length=30)),
                ('object', models.CharField(max_length=1200)),
                ('detail', models.JSONField(blank=True, default=dict)),
                ('first_seen', models.DateTimeField()),
                ('last_seen', models.DateTimeField()),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
                ('resolution', models.CharField(blank=True, max_length=200)),
                ('inbox_event', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='intake.inboxevent')),
                ('tenant', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='intake.tenant')),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='finding_set', to='reconciliation.reconciliationrun')),
            ],
            options={
                'default_permissions': ('view',),
                'indexes': [models.Index(condition=models.Q(('kind', 'unmapped'), ('resolved_at__isnull', True)), fields=['inbox_event'], name='finding_open_unmapped')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('resolved_at__isnull', True)), fields=('kind', 'object'), name='finding_one_open_per_object'), models.CheckConstraint(condition=models.Q(('resolved_at__isnull', True), models.Q(('resolution', ''), _negated=True), _connector='OR'), name='finding_resolved_has_resolution')],
            },
        ),
    ]
