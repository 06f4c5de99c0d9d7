# The circuit breaker (ticketing.breaker) and the staff emails it and escalation send (Notification).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('intake', '0008_copied_messages'),
        ('ticketing', '0008_copied_messages'),
    ]

    operations = [
        migrations.AddField(
            model_name='destination',
            name='paused_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='destination',
            name='paused_by',
            field=models.CharField(blank=True, max_length=150),
        ),
        migrations.AddField(
            model_name='destination',
            name='paused_reason',
            field=models.CharField(blank=True, max_length=500),
        ),
        migrations.CreateModel(
            name='Notification',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200, unique=True)),
                ('kind', models.CharField(choices=[('escalation', 'Escalation'), ('digest', 'Digest'), ('breaker', 'Breaker')], max_length=20)),
                ('escalation_at', models.DateTimeField(blank=True, null=True)),
                ('recipients', models.JSONField(blank=True, default=list)),
                ('subject', models.CharField(max_length=300)),
                ('sent_at', models.DateTimeField()),
                ('destination', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ticketing.destination')),
                ('inbox_event', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='intake.inboxevent')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='intake.tenant')),
            ],
            options={
                'default_permissions': ('view',),
            },
        ),
        migrations.CreateModel(
            name='DestinationAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField()),
                ('ok', models.BooleanField()),
                ('reason', models.CharField(blank=True, max_length=50)),
                ('destination', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ticketing.destination')),
            ],
            options={
                'indexes': [models.Index(fields=['destination', 'at'], name='destination_attempt_recent')],
            },
        ),
    ]
