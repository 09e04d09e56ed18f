"""CLI subcommands that manage a data directory (origins, groups, executor keys).

Each module offers `add_parser(parser, add_setting_flags)` and `run(args, settings) -> int`.
"""
