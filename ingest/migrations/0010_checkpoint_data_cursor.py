# the data cursor a restore from a checkpoint resumes at. (Numbered after main's
# 0009_receipt_watermark, which landed first: linear, no merge migration needed.)

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0009_receipt_watermark"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpointrecord",
            name="data_cursor",
            field=models.BigIntegerField(null=True),
        ),
    ]
