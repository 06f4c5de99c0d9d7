"""The shared request budget of each destination (ticketing.budget): one row per destination, written by one
upsert per request. A plain table, not a model: nothing but that module reads it, in SQL both PostgreSQL and
SQLite run. No foreign key, so that flushing the destinations (the test suite's TRUNCATE) is not held up by it;
a deleted destination's row is a harmless leftover (`budget.forget` drops it)."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("ticketing", "0013_files_people_progress"),
    ]

    operations = [
        migrations.RunSQL(
            sql="CREATE TABLE ticketing_destination_budget ("
                "destination_id bigint PRIMARY KEY, "
                "spent_until double precision NOT NULL)",
            reverse_sql="DROP TABLE ticketing_destination_budget",
        ),
    ]
