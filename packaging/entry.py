"""The standalone executable's entry point: the same program as `appliance` / `python -m appliance`."""

import multiprocessing

# Lease-check workers are spawned processes: in the frozen executable a child is this binary again,
# and freeze_support() makes it run the worker instead of the command line.
multiprocessing.freeze_support()

from appliance.cli import main  # noqa: E402

raise SystemExit(main())
