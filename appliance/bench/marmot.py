"""`appliance bench marmot-join`: the draft multi-device External Commit in a group of N members.

Builds a multi-device group of `--members` accounts the way it happens in practice (the creator adds
everyone in one Commit; every leaf carries its 0x8009 proof), then times, as medians of `--repeat`
runs with group state decoded from and encoded to bytes as a real caller would:

- build: the new device prepares its joining leaf from the GroupInfo (verifying it and the tree),
  an admin signs the kind 452 authorization, the device finishes the External Commit;
- process: an existing member validates it with every draft rule (signaling gate over all leaves,
  account proof, join PSK, AppEphemeral authorization) and applies it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--members", type=int, default=100, help="Group size before the join (default 100).")
    p.add_argument("--repeat", type=int, default=5, help="Runs per figure; the median is printed (default 5).")


def run(args: argparse.Namespace) -> int:
    from appliance.marmot import mls, multidevice as md
    from appliance.marmot.device import Device
    from appliance.nostr.keys import generate_secret

    if args.members < 2 or args.repeat < 1:
        print("appliance bench marmot-join: --members must be at least 2 and --repeat at least 1", file=sys.stderr)
        return 2
    relays = ["wss://relay.example.org"]
    t0 = time.perf_counter()
    admin = Device(generate_secret())
    kps = [Device(generate_secret()).new_key_package(relays, draft=True) for _ in range(args.members - 1)]
    gid, _ = admin.create_group("bench", relays, kps, multi_device=True)
    state = admin.group(gid).to_bytes()
    print(f"appliance bench marmot-join: group of {args.members} members built in "
          f"{time.perf_counter() - t0:.1f} s (draft multi-device; figures are medians of {args.repeat})")

    builds, processes = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        group = mls.Group.from_bytes(state)
        _, psk = md.join_psk(group)
        info = group.group_info()
        pending, leaf = md.prepare_external_join(admin.secret, info, psk)
        proof = md.authorize_join(admin.secret, pending.candidate_context(), leaf)
        new, message = md.finish_external_join(pending, admin.secret, proof)
        new.to_bytes()
        builds.append(time.perf_counter() - t)
        t = time.perf_counter()
        processed = md.process_external_commit(mls.Group.from_bytes(state), message)
        processed.group.to_bytes()
        processes.append(time.perf_counter() - t)
        assert processed.group.epoch_authenticator == new.epoch_authenticator
    print(f"  build External Commit (GroupInfo in, authorization, commit out): "
          f"{statistics.median(builds) * 1000:.1f} ms")
    print(f"  process External Commit as a member (all draft rules, then MLS):  "
          f"{statistics.median(processes) * 1000:.1f} ms")
    print(f"  commit message {len(message)} bytes; GroupInfo {len(info)} bytes")
    return 0
