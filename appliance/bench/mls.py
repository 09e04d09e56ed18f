"""MLS core figures: `appliance bench mls [--sizes 100,1000] [--adds 100] [--repeat 3]`.

Prints, for cipher suite 0x0001 and state kept as bytes between operations (every timed step
decodes the state it starts from and encodes the state it ends with, as a real caller would):

- add N members in one Commit (KeyPackages verified, path, Welcome), and process that Commit as
  an existing member;
- build an External Commit from a GroupInfo (GroupInfo and tree verified) and process it as an
  existing member, in groups of each size.

Groups are built as they are in practice: the creator adds everyone in one Commit, then a member
that joined by Welcome measures. Each figure is the median of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from appliance.marmot.mls.group import Group, create_key_package, external_join, join_from_welcome


def _median(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def _group(size: int) -> tuple[bytes, bytes]:
    """(creator state, a Welcome-joined member's state) for a group of `size` members."""
    creator = Group.create(b"bench-%d" % size, b"creator")
    kps = [create_key_package(b"member-%d" % i) for i in range(size - 1)]
    out = creator.commit(add=[k.key_package for k in kps])
    member = join_from_welcome(out.welcome, kps[0])
    return out.group.to_bytes(), member.to_bytes()


def bench_add(adds: int, repeat: int) -> list[tuple[str, float]]:
    creator = Group.create(b"bench-add", b"creator")
    kp = create_key_package(b"member")
    out = creator.commit(add=[kp.key_package])
    creator_state, member_state = out.group.to_bytes(), join_from_welcome(out.welcome, kp).to_bytes()
    kps = [create_key_package(b"new-%d" % i).key_package.encode() for i in range(adds)]

    def build():
        return Group.from_bytes(creator_state).commit(add=kps)

    t_build, outcome = _median(build, repeat)

    def process():
        return Group.from_bytes(member_state).process(outcome.message).group.to_bytes()

    t_process, _ = _median(process, repeat)
    return [(f"add {adds} members in one Commit (build, incl. Welcome)", t_build),
            ("process that Commit as a member", t_process)]


def bench_external(size: int, repeat: int) -> list[tuple[str, float]]:
    t0 = time.perf_counter()
    creator_state, member_state = _group(size)
    setup = time.perf_counter() - t0
    group_info = Group.from_bytes(member_state).group_info()

    def build():
        return external_join(group_info, b"new-device")

    t_build, (joiner, commit) = _median(build, repeat)

    def process():
        return Group.from_bytes(creator_state).process(commit).group.to_bytes()

    t_process, _ = _median(process, repeat)
    return [(f"group of {size}: External Commit build (GroupInfo + tree verified)", t_build),
            (f"group of {size}: External Commit process as a member", t_process),
            (f"group of {size}: setup (one Commit adding {size - 1}, one Welcome join)", setup)]


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="100,1000", help="group sizes for the External Commit figures")
    ap.add_argument("--adds", type=int, default=100, help="members added in one Commit")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (median reported)")


def run(args: argparse.Namespace) -> int:
    rows = bench_add(args.adds, args.repeat)
    for size in (int(s) for s in args.sizes.split(",") if s):
        rows += bench_external(size, args.repeat)
    width = max(len(name) for name, _ in rows)
    print(f"MLS core, cipher suite 0x0001, median of {args.repeat}")
    for name, seconds in rows:
        print(f"  {name:<{width}}  {seconds * 1000:9.1f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="appliance bench mls", description=__doc__.split("\n\n")[0])
    add_args(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
