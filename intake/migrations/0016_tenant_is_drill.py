from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('intake', '0015_audit_kinds_of_issue_20'),
    ]

    operations = [
        migrations.AddField(
            model_name='tenant',
            name='is_drill',
            field=models.BooleanField(default=False, editable=False),
        ),
    ]
