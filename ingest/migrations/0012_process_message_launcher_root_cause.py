# A process exit's scrubbed message, and the launcher (TorchElastic) that named it its root
# cause: the failure evidence a launcher reads from its error files.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0011_utilisation"),
    ]

    operations = [
        migrations.AddField(
            model_name="processrecord",
            name="message",
            field=models.CharField(max_length=256, null=True),
        ),
        migrations.AddField(
            model_name="processrecord",
            name="launcher_root_cause",
            field=models.CharField(max_length=64, null=True),
        ),
    ]
