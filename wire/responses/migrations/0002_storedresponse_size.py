"""The record's size, for the per-key byte cap; rows stored before it are measured."""

import json

from django.db import migrations, models


def measure(apps, schema_editor):
    stored = apps.get_model("responses_api", "StoredResponse")
    for row in stored.objects.all().only("id", "conversation", "body").iterator():
        size = len(json.dumps(row.conversation)) + len(json.dumps(row.body))
        stored.objects.filter(id=row.id).update(size=size)


class Migration(migrations.Migration):
    dependencies = [("responses_api", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="storedresponse",
            name="size",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.RunPython(measure, migrations.RunPython.noop),
    ]
