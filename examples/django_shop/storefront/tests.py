"""The project's own tests, run by Django's test runner (``python manage.py test storefront``).

Django builds the test database with every migration, jobbus's schema included, and jobbus follows
Django to it. `TransactionTestCase`, because a worker reads committed jobs only: under `TestCase`
the jobs a test enqueues stay inside the test's transaction, where no worker sees them.
"""

from django.test import TransactionTestCase

from jobbus.contrib.django import get_app
from storefront.models import Order, Stock


class PlaceOrderTests(TransactionTestCase):
    def test_an_order_sends_its_receipt(self) -> None:
        Stock.objects.create(sku="mug", quantity=5)
        response = self.client.post(
            "/orders", {"email": "a@example.com", "sku": "mug"}, content_type="application/json"
        )
        self.assertEqual(response.status_code, 200)
        self.assertEqual(get_app().sync.drain(), {"completed": 1})
        self.assertTrue(Order.objects.get().receipt_sent)

    def test_out_of_stock_enqueues_nothing(self) -> None:
        Stock.objects.create(sku="mug", quantity=0)
        response = self.client.post(
            "/orders", {"email": "a@example.com", "sku": "mug"}, content_type="application/json"
        )
        self.assertEqual(response.status_code, 409)
        self.assertEqual(get_app().sync.drain(), {})
        self.assertFalse(Order.objects.exists())
