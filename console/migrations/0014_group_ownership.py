"""Who owns a group (docs/security.md, "Who owns a group"): the scheduler job whose nodes
attest it, the end of its first generation's rendezvous, and its generation moves of the
current hour. A group that already has ranks placed has had its rendezvous: it is closed
(its nodes are ingest.GroupMember rows, ingest migration 0011)."""

from django.db import migrations, models
from django.db.models import Exists, OuterRef
from django.utils import timezone


def close_placed_rendezvous(apps, schema_editor):
    group = apps.get_model("console", "ConsistencyGroup")
    rank = apps.get_model("console", "Rank")
    group.objects.filter(Exists(rank.objects.filter(group=OuterRef("pk")))).update(
        rendezvous_until=timezone.now()
    )


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0013_action_executor"),
    ]

    operations = [
        migrations.AddField(
            model_name="consistencygroup",
            name="generation_window_advance",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="consistencygroup",
            name="generation_window_start",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="consistencygroup",
            name="owner_job",
            field=models.CharField(blank=True, default="", max_length=128),
        ),
        migrations.AddField(
            model_name="consistencygroup",
            name="rendezvous_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(close_placed_rendezvous, migrations.RunPython.noop),
    ]
