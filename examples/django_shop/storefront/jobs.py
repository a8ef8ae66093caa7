"""The project's jobbus App (``JOBBUS = {"app": "storefront.jobs:app"}``) and a typed task of its own.

Its database is Django's (`jobbus.contrib.django` sets the dsn); `manage.py jobbus worker` runs it.
"""

import jobbus

app = jobbus.App()


@app.task("shop.restock_alert", queue="default")
def restock_alert(sku: str, left: int) -> dict[str, object]:
    return {"sku": sku, "left": left}
