"""`tests.apps`'s app, imported only once the file named by JOBBUS_TEST_IMPORT_GATE exists: a worker process
held in its start-up for as long as a test needs (a signal sent then meets a worker still loading)."""

import os
import time
from pathlib import Path

gate = Path(os.environ["JOBBUS_TEST_IMPORT_GATE"])
print("importing the application", flush=True)
while not gate.exists():
    time.sleep(0.01)

from tests.apps import app  # noqa: E402

__all__ = ["app"]
