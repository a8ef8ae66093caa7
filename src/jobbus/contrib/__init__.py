"""Framework integrations: `jobbus.contrib.asgi` (FastAPI, Starlette), `jobbus.contrib.fastapi` (the
dashboard behind a FastAPI dependency) and `jobbus.contrib.django` (with `.dashboard`: the dashboard
for Django's staff users).

Each imports its framework only when imported itself; jobbus does not depend on any of them.
"""
