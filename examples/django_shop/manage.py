#!/usr/bin/env python
"""The example project's manage.py: ``python manage.py migrate``, ``python manage.py jobbus worker``."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
