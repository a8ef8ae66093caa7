"""The exceptions jobbus raises; every one says what to do next."""


class JobbusError(Exception):
    """Base class of every error jobbus raises on purpose."""


class NonRetryableError(JobbusError):
    """Raised by a handler to fail its job at once, without further attempts."""


class LeaseLostError(JobbusError):
    """The caller no longer holds the job's current, unexpired lease: its write was rejected."""


class InvalidStateError(JobbusError):
    """The job does not exist or is not in a state that allows the operation."""


class SchemaError(JobbusError):
    """The database schema is missing or older than this code."""


class InvalidJobError(JobbusError, ValueError):
    """A job (or setting of one) was refused before anything was written."""
