"""`appliance bench`: measure relay ingest and query speed on this machine."""

from __future__ import annotations

import argparse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_subparsers(dest="bench_command", metavar="WHAT", required=True)


def run(args: argparse.Namespace) -> int:
    return 2
