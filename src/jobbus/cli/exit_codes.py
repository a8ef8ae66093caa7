"""Process exit codes (sysexits.h), as SPEC section 6 fixes them."""

OK = 0
FAILURE = 1  # the operation was refused (InvalidStateError, a wait that timed out)
RESTART = 75  # EX_TEMPFAIL: restart requested (control command or memory limit)
USAGE = 64  # EX_USAGE: bad arguments or input
UNAVAILABLE = 69  # EX_UNAVAILABLE: database unreachable at start
SOFTWARE = 70  # EX_SOFTWARE: internal error
LOCKED = 73  # EX_CANTCREAT: a migration could not take its locks in time (jobbus migrate)
CONFIG = 78  # EX_CONFIG: bad --app, schema missing or outdated
