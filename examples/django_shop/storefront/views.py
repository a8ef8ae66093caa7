"""A view that writes an order and enqueues its jobs in one Django transaction."""

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from jobbus.contrib.django import connection
from storefront.jobs import restock_alert
from storefront.models import Order, Stock
from storefront.tasks import send_receipt


class OutOfStock(Exception):
    pass


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(email=body["email"], sku=body["sku"])
            receipt = send_receipt.enqueue(order.id)  # Django's tasks API: joins this transaction
            stock = Stock.objects.select_for_update().get(sku=order.sku)
            if stock.quantity == 0:
                raise OutOfStock(order.sku)  # the order and the receipt job roll back together
            stock.quantity -= 1
            stock.save()
            if stock.quantity < 2:  # jobbus's own typed task, on Django's connection
                restock_alert.options(connection=connection()).defer_sync(stock.sku, stock.quantity)
    except OutOfStock:
        return JsonResponse({"error": f"{body['sku']} is out of stock"}, status=409)
    return JsonResponse({"order_id": order.id, "receipt_job": receipt.id})
