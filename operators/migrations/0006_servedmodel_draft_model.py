from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operators", "0005_rename_modelconfig_servedmodel"),
    ]

    operations = [
        migrations.AddField(
            model_name="servedmodel",
            name="draft_model",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Speculation: a GGUF with the same vocabulary, inside a model "
                "folder (empty: none).",
                max_length=4096,
            ),
        ),
    ]
