"""The project as an ASGI application: Django, and the jobbus dashboard at /ops/jobs/ for staff users.

    uvicorn storefront_site.asgi:application --port 8000

Staff log in at /admin/ (``python manage.py createsuperuser``); /ops/jobs/ then shows them the
dashboard (superusers as admins, other staff as operators), and sends anyone else to the admin's
login page.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront_site.settings")
django_app = get_asgi_application()  # first: it sets Django up

from jobbus.contrib.django import get_app  # noqa: E402
from jobbus.contrib.django.dashboard import mount_dashboard  # noqa: E402
from jobbus.dashboard import create_app  # noqa: E402

application = mount_dashboard(django_app, "/ops/jobs", create_app(get_app(), host_auth=True))
