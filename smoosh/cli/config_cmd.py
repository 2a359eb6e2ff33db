"""``smoosh config check`` and ``smoosh config sample``: validate a config, or print a shipped file."""

from __future__ import annotations

import argparse
import sys

from smoosh.cli.commands import print_json
from smoosh.cli.messages import print_config_error, print_warning
from smoosh.errors import ConfigError

__all__ = ["cmd_config_check", "cmd_config_sample"]


def cmd_config_check(args: argparse.Namespace) -> int:
    """``smoosh config check``: validate, print the error or the warnings; exit 1 on an error.

    With no config file at all (no ``--config``, no ``$SMOOSH_CONFIG``, no ``conf/smoosh.ini``
    here) there is nothing of the user's to check: it says so and how to get one, exit 1,
    rather than judging the defaults' relative ``watch`` against wherever it happens to run.
    """
    from smoosh.config import load_config
    from smoosh.config.checks import check_directories, check_store
    from smoosh.config.shipped import find_config, no_config_file_message

    try:
        if find_config(args.config) is None:
            raise ConfigError(no_config_file_message())
        config = load_config(args.config, log_warnings=False)  # printed below, once each
        check_directories(config)
        check_store(config)
    except ConfigError as e:
        if args.json:
            print_json({"ok": False, "config": getattr(e, "path", None) or args.config, "error": str(e),
                        "warnings": [], "channels": []})
        else:
            print_config_error(str(e))
        return 1
    if args.json:
        print_json({"ok": True, "config": config.path, "error": None, "warnings": list(config.warnings),
                    "channels": list(config.channels)})
        return 0
    for warning in config.warnings:
        print_warning(warning)
    print(f"{config.path or 'defaults'}: ok ({len(config.channels)} channel(s))")
    return 0


def cmd_config_sample(args: argparse.Namespace) -> int:
    """``smoosh config sample [--unit | --rules | --dashboard]``: print a file smoosh ships.

    The sample config by default (every key with its default, as the repository's
    ``conf/smoosh.ini``); ``--unit`` the systemd unit, ``--rules`` the Prometheus alerting
    rules, ``--dashboard`` the Grafana dashboard. A user who installed from the package index
    redirects it where it belongs: ``smoosh config sample > /etc/smoosh/smoosh.ini``.
    """
    from smoosh.config.shipped import shipped_text

    sys.stdout.write(shipped_text(args.sample))
    return 0
