"""What the appliance's worker processes (lease checks, signature checks) share."""

from __future__ import annotations

import os
import threading
import time

# Seconds between a worker's checks that the appliance process is still its parent.
PARENT_CHECK_INTERVAL = 1.0


def watch_parent(parent_pid: int) -> None:
    """In a worker: exit when the appliance is gone (even killed with SIGKILL), never linger."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_INTERVAL)
        os._exit(0)

    threading.Thread(target=watch, name="appliance-parent-watch", daemon=True).start()
