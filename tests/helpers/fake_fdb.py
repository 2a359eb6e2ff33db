"""A stand-in for the FoundationDB binding and its client library (none can be installed here).

It behaves as the real ones do where it matters: the 7.1 binding has no LATEST_API_VERSION, a
library refuses a binding whose header version is above its maximum, and a cluster answers
the status key with its document (or raises, for an unreachable one).
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest


class FakeCapi:
    def __init__(self, max_api: int, client: bytes) -> None:
        self.max_api = max_api

        def fdb_get_client_version() -> bytes:
            return client

        # A plain function, as a ctypes one: the adapter sets its ``restype``.
        self.fdb_get_client_version = fdb_get_client_version

    def fdb_get_max_api_version(self) -> int:
        return self.max_api


class FakeBinding(types.ModuleType):
    """A binding of one version over a client library of another."""

    def __init__(self, binding_api: int | None, library_api: int, client: str = "7.3.43,deadbeef,fdb00b073000000") -> None:
        super().__init__("fdb")
        if binding_api is not None:
            self.LATEST_API_VERSION = binding_api
        self.__version__ = {None: None, 710: "7.1.67", 730: "7.3.79", 800: "8.0.0"}[binding_api]
        self._header = binding_api or 710
        self.selected: int | None = None
        capi = FakeCapi(library_api, client.encode())
        self.impl = types.ModuleType("fdb.impl")
        self.impl._capi = capi  # type: ignore[attr-defined]
        self.status: dict[str, Any] | Exception = {}

    def is_api_version_selected(self) -> bool:
        return self.selected is not None

    def get_api_version(self) -> int:
        assert self.selected is not None
        return self.selected

    def api_version(self, version: int) -> None:
        library_max = self.impl._capi.max_api  # type: ignore[attr-defined]
        if version > self._header:
            raise RuntimeError(f"Latest known FDB API version is {self._header}")
        if self._header > library_max:
            raise RuntimeError("This version of the FoundationDB Python binding is not supported by the installed FoundationDB C library.")
        self.selected = version

    def open(self, cluster_file: str | None = None) -> Any:
        if isinstance(self.status, Exception):
            raise self.status
        status = self.status

        class Future:
            def wait(self) -> bytes:
                return json.dumps(status).encode()

        class Options:
            timeout_ms = None

            def set_timeout(self, ms: int) -> None:
                Options.timeout_ms = ms

        class Tr:
            options = Options()

            def get(self, key: bytes) -> Future:
                assert key == b"\xff\xff/status/json"
                return Future()

        class Db:
            def create_transaction(self) -> Tr:
                return Tr()

        return Db()


def install_fake_fdb(monkeypatch: pytest.MonkeyPatch, binding: FakeBinding | None, *, impl_missing: bool = False) -> None:
    """Make ``import fdb`` give ``binding`` (None: no binding at all) for the rest of the test."""
    monkeypatch.setitem(sys.modules, "fdb", binding)
    monkeypatch.setitem(sys.modules, "fdb.impl", None if impl_missing or binding is None else binding.impl)
