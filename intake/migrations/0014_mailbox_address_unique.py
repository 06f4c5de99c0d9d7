"""The database refuses a second mailbox with the same address key (0013 filled the keys and found no two alike)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('intake', '0013_verified_domains_and_address_keys'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='mailbox',
            constraint=models.UniqueConstraint(fields=('address_key',), name='mailbox_address_unique', violation_error_message='This address is already used by another mailbox.'),
        ),
        migrations.AddConstraint(
            model_name='mailbox',
            constraint=models.CheckConstraint(condition=models.Q(('address_key', ''), _negated=True), name='mailbox_address_key_set'),
        ),
    ]
