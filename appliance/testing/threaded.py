"""Running a local stand-in (the APNs and FCM emulators, the push distributor) on a thread of its
own, for tests whose appliance runs as a separate process."""

from __future__ import annotations

import asyncio
import threading
from typing import IO, Self


class OnItsOwnThread:
    """`start_in_thread`/`stop_thread` for a server with `async start(host, port)` and `async
    stop()`; the class sets THREAD_NAME and its __init__ sets `_thread`, `_loop`, `_log` (or None)."""

    THREAD_NAME = "stand-in"
    _thread: threading.Thread | None
    _loop: asyncio.AbstractEventLoop | None
    _log: IO[str] | None

    async def start(self, host: str, port: int) -> Self: ...

    async def stop(self) -> None: ...

    def start_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> Self:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start(host, port))
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                failed.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.stop())
                loop.close()

        self._thread = threading.Thread(target=run, name=self.THREAD_NAME, daemon=True)
        self._thread.start()
        ready.wait(30)
        if failed:
            raise failed[0]
        return self

    def stop_thread(self) -> None:
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None
        if self._log is not None:
            self._log.close()
            self._log = None
