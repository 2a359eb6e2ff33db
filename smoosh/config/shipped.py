"""The files smoosh ships for its users: the sample config, the systemd unit, the Prometheus
rules and the Grafana dashboard.

They are package data (``smoosh/conf_files``, a symbolic link to the repository's ``conf/``
in a checkout, real files in the wheel and the sdist), so a user who installed smoosh from
the package index gets what a user of the repository has: ``smoosh config sample`` prints
them.
"""

from __future__ import annotations

import importlib.resources
import os

from smoosh.config.defaults import CONFIG_ENV, DEFAULT_CONFIG_PATH
from smoosh.errors import SmooshError

__all__ = ["SHIPPED_FILES", "shipped_text", "find_config", "no_config_file_message"]

#: What ``smoosh config sample`` can print, by name, with the file's path inside the package's
#: ``conf_files`` directory (the repository's ``conf/``).
SHIPPED_FILES: dict[str, str] = {
    "ini": "smoosh.ini",
    "unit": "smoosh.service",
    "rules": "prometheus/smoosh-rules.yml",
    "dashboard": "grafana/smoosh.json",
}

#: The package directory that holds them.
PACKAGE_DIR = "conf_files"


def shipped_text(which: str) -> str:
    """The text of one shipped file, read from the installed package.

    Parameters:
        which: a key of :data:`SHIPPED_FILES` (``ini``, ``unit``, ``rules``, ``dashboard``).

    Returns:
        The file's text.

    Raises:
        KeyError: ``which`` names no shipped file.
        SmooshError: the file is missing from the installation (a broken install).
    """
    resource = importlib.resources.files("smoosh").joinpath(PACKAGE_DIR, *SHIPPED_FILES[which].split("/"))
    try:
        return resource.read_text(encoding="utf-8")
    except OSError as e:
        raise SmooshError(f"the shipped {SHIPPED_FILES[which]} is missing from this installation of smoosh "
                          f"({e.strerror or e}): reinstall smoosh-compactor") from None


def find_config(path: str | None) -> str | None:
    """The config file ``load_config(path)`` reads, or None when it would use the defaults.

    Parameters:
        path: the ``--config`` argument (None when not given).

    Returns:
        ``path``, else ``$SMOOSH_CONFIG``, else ``conf/smoosh.ini`` when that file exists
        (relative to the working directory); None when none of them names a file.
    """
    if path is not None:
        return path
    named = os.environ.get(CONFIG_ENV)
    if named:
        return named
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None


def no_config_file_message() -> str:
    """What ``smoosh config check`` says when no config file was named and none is found here.

    Returns:
        One sentence naming where smoosh looked and the commands that get a user going.
    """
    return (f"no config file: neither --config nor ${CONFIG_ENV} names one, and there is no "
            f"{DEFAULT_CONFIG_PATH} in {os.getcwd()}; start from the shipped sample: "
            "`smoosh config sample > smoosh.ini`, set `watch` to your database directories, "
            "then `smoosh config check --config smoosh.ini`")
