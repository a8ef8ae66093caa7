"""Framework integrations: `jobbus.contrib.asgi` (FastAPI, Starlette) and `jobbus.contrib.django`.

Each imports its framework only when imported itself; jobbus does not depend on any of them.
"""
