from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("email", models.CharField(max_length=200)),
                ("sku", models.CharField(max_length=50)),
                ("receipt_sent", models.BooleanField(default=False)),
            ],
        ),
        migrations.CreateModel(
            name="Stock",
            fields=[
                ("sku", models.CharField(max_length=50, primary_key=True, serialize=False)),
                ("quantity", models.PositiveIntegerField()),
            ],
        ),
    ]
