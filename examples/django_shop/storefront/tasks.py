"""A task of Django's own tasks framework: `JobbusBackend` enqueues it, a jobbus worker runs it."""

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2 and the backport

from storefront.models import Order


@task(queue_name="mail")
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    # ... send the mail ...
    Order.objects.filter(pk=order_id).update(receipt_sent=True)
    return f"receipt for order {order_id} sent to {order.email}"
