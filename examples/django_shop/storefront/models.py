from django.db import models


class Order(models.Model):
    email = models.CharField(max_length=200)
    sku = models.CharField(max_length=50)
    receipt_sent = models.BooleanField(default=False)


class Stock(models.Model):
    sku = models.CharField(max_length=50, primary_key=True)
    quantity = models.PositiveIntegerField()
