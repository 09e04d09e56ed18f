"""The negentropy reference test suite's stdio harness for appliance.nostr.negentropy.

Lines in: `item,TIMESTAMP,HEXID`, `seal`, `initiate`, `msg,HEX`; lines out: `msg,HEX`, `have,HEXID`,
`need,HEXID`, `done` (hoytech/negentropy test/js/harness.js speaks the same). FRAMESIZELIMIT in
the environment sets the frame size limit. Run as `python -m tests.nostr.negentropy_harness`.
"""

from __future__ import annotations

import os
import sys

from appliance.nostr.negentropy import Negentropy, Storage


def main() -> int:
    limit = int(os.environ.get("FRAMESIZELIMIT") or 0)
    items: list[tuple[int, bytes]] = []
    ne: Negentropy | None = None
    out = sys.stdout
    for line in sys.stdin:
        parts = line.strip().split(",")
        cmd = parts[0]
        if cmd == "item":
            if len(parts) != 3:
                raise SystemExit("too few items")
            items.append((int(parts[1]), bytes.fromhex(parts[2].strip())))
        elif cmd == "seal":
            ne = Negentropy(Storage.from_items(items), limit)
        elif cmd == "initiate":
            q = ne.initiate()
            if limit and len(q) > limit:
                raise SystemExit("frameSizeLimit exceeded")
            out.write(f"msg,{q.hex()}\n")
        elif cmd == "msg":
            query = bytes.fromhex(parts[1] if len(parts) > 1 else "")
            if ne.is_initiator:
                q, have, need = ne.reconcile_client(query)
                for id_ in have:
                    out.write(f"have,{id_.hex()}\n")
                for id_ in need:
                    out.write(f"need,{id_.hex()}\n")
            else:
                q = ne.reconcile(query)
            if limit and q is not None and len(q) > limit:
                raise SystemExit("frameSizeLimit exceeded")
            out.write("done\n" if q is None else f"msg,{q.hex()}\n")
        else:
            raise SystemExit(f"unknown cmd: {cmd}")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
