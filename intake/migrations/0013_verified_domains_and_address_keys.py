"""Mailbox addresses become unique across tenants (by `address_key`) and tenants get verified domains.

The data step fills `address_key` (intake.domains.address_key) and stops the migration when two mailboxes
share one: which of them keeps the address is an operator's decision (handing it to the wrong tenant is the
very takeover this closes), so nothing is renamed or dropped automatically. It then verifies, for each tenant,
the domains its existing mailboxes use when no other tenant's mailbox uses them too, and names the domains it
left unverified for a superuser to assign. The unique constraint itself is 0014 (its own transaction).
"""
import sys
from collections import defaultdict

import django.db.models.deletion
import django.db.models.functions.text
from django.db import migrations, models


class AddressCollision(RuntimeError):
    pass


def fill_keys_and_verify_domains(apps, schema_editor):
    from intake.domains import address_key, split_address
    from intake.logging import mask_address

    mailbox_model = apps.get_model("intake", "Mailbox")
    domain_model = apps.get_model("intake", "VerifiedDomain")
    holders = defaultdict(list)
    tenants_of_domain = defaultdict(set)
    for mailbox in mailbox_model.objects.select_related("tenant").order_by("pk"):
        key = address_key(mailbox.address) or f"invalid-address:{mailbox.pk}"  # unique; fixed on the next edit
        mailbox_model.objects.filter(pk=mailbox.pk).update(address_key=key)
        holders[key].append(mailbox)
        domain = split_address(mailbox.address)[1]
        if domain:
            tenants_of_domain[domain].add(mailbox.tenant)
    collisions = {key: rows for key, rows in holders.items() if len(rows) > 1}
    if collisions:
        lines = [f"  {mask_address(key)}: " + ", ".join(f"mailbox {m.pk} {m.slug!r} (tenant {m.tenant.slug})"
                                                       for m in rows)
                 for key, rows in sorted(collisions.items())]
        raise AddressCollision(
            "Mailbox addresses must be unique across the platform (ignoring case and +tags), and these are not:\n"
            + "\n".join(lines)
            + "\nDecide which mailbox keeps each address, change the others' addresses (or their tenant), then "
              "migrate again. Nothing was changed.")
    shared = {}
    for domain, tenants in sorted(tenants_of_domain.items()):
        if len(tenants) == 1:
            (tenant,) = tenants
            domain_model.objects.get_or_create(domain=domain, defaults={"tenant": tenant,
                                                                        "verified_by": "migration:intake.0013"})
            sys.stdout.write(f"\n  verified {domain} for tenant {tenant.slug} (its mailboxes use it)")
        else:
            shared[domain] = sorted(t.slug for t in tenants)
    for domain, slugs in shared.items():
        sys.stdout.write(f"\n  NOT verified: {domain} is used by mailboxes of tenants {', '.join(slugs)}; "
                         f"a superuser gives it to one of them (Tenant -> verified domains)")


class Migration(migrations.Migration):

    dependencies = [
        ('intake', '0012_mailbox_known_provider'),
    ]

    operations = [
        migrations.CreateModel(
            name='VerifiedDomain',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('domain', models.CharField(help_text='Lower case, without a trailing dot; an internationalized name in its xn-- form. One tenant per domain.', max_length=253, unique=True)),
                ('verified_by', models.CharField(blank=True, max_length=150)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='verified_domains', to='intake.tenant')),
            ],
            options={
                'ordering': ('domain',),
                'default_permissions': ('view',),
                'constraints': [models.CheckConstraint(condition=models.Q(('domain', django.db.models.functions.text.Lower('domain')), models.Q(('domain', ''), _negated=True)), name='verified_domain_is_normalised')],
            },
        ),
        migrations.AddField(
            model_name='mailbox',
            name='address_key',
            field=models.CharField(default='', editable=False, max_length=320),
            preserve_default=False,
        ),
        migrations.RunPython(fill_keys_and_verify_domains, migrations.RunPython.noop),
    ]
