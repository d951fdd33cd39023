"""The node whose ingest batch created a group: the only one that may transition it before
any rank is placed (finding 3). Existing groups get NULL (no creator known)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0011_incident_costs"),
    ]

    operations = [
        migrations.AddField(
            model_name="consistencygroup",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="console.node",
            ),
        ),
    ]
