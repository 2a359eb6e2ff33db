"""The security rules of DESIGN §10 as tests: loopback default, token for POSTs off loopback,
roots after symlinks, bounded msgpack decoding, and no pickle / eval / exec / shell in the code."""

from __future__ import annotations

import ast
import http.client
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers.daemon import free_port, write_config
from smoosh import Server, load_config
from smoosh.config import Config, parse_config
from smoosh.errors import ConfigError
from smoosh.daemon.api.http import AdminServer, is_loopback, parse_address

PROJECT = Path(__file__).resolve().parents[2]
#: The packages whose sources the grep rules cover.
SOURCE_DIRS = ("smoosh", "channels", "persist")
TOKEN = "s3cret-token-0123456789"


def python_sources() -> list[Path]:
    files = [p for d in SOURCE_DIRS for p in sorted((PROJECT / d).rglob("*.py"))]
    assert len(files) > 20, "the source tree was not found"
    return files


def test_the_default_config_binds_the_admin_api_to_loopback_only(tmp_path: Path) -> None:
    host, _port = parse_address(Config.default(cwd=str(tmp_path)).http)
    assert is_loopback(host)


def test_an_off_loopback_address_without_a_token_is_a_config_error_naming_http_and_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config("[smoosh]\nhttp = 0.0.0.0:5986\n", "/etc/smoosh.ini", cwd=str(tmp_path))
    assert "http" in str(e.value) and "token" in str(e.value) and e.value.key == "http"


def test_smoosh_run_refuses_an_off_loopback_http_flag_without_a_token(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port())
    out = subprocess.run([sys.executable, "-m", "smoosh", "run", "--config", str(config), "--http", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "binding off loopback needs [smoosh] token" in out.stderr


@pytest.fixture
def exposed(tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """A server bound to every interface (off loopback), with a token."""
    config = load_config(str(write_config(tmp_path, port=0, extra_global=f"token = {TOKEN}\nwait_secs = 3600")),
                         cwd=str(tmp_path))
    server = Server(config, workers=0, watch_config=False)
    server.start()
    admin = AdminServer(server, "0.0.0.0:0")
    admin.start()
    try:
        yield "127.0.0.1", int(admin.address.rsplit(":", 1)[1]), tmp_path
    finally:
        admin.stop()
        server.stop()


def call(host: str, port: int, method: str, path: str, body: object = None, auth: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth is not None else {})}
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_off_loopback_every_post_needs_the_bearer_token(exposed: tuple[str, int, Path]) -> None:
    host, port, base = exposed
    key = str(base / "dbs" / "x.db")
    for path, body in (("/enqueue", {"keys": [key]}), ("/suspend", {}), ("/resume", {}), ("/flush", {})):
        for auth in (None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN):
            status, answer = call(host, port, "POST", path, body, auth)
            assert status == 401 and answer == {"error": "missing or wrong bearer token"}, (path, auth)
        status, _ = call(host, port, "POST", path, body, f"Bearer {TOKEN}")
        assert status in (200, 202), path
    # Reads stay open: monitoring needs no secret.
    assert call(host, port, "GET", "/status")[0] == 200


def test_an_exposed_server_without_a_token_refuses_every_post(tmp_path: Path) -> None:
    # An AdminServer bound off loopback bypasses the config check: the handler must fail closed.
    config = load_config(str(write_config(tmp_path, port=0)), cwd=str(tmp_path))
    server = Server(config, workers=0, watch_config=False)
    server.start()
    admin = AdminServer(server, "0.0.0.0:0")
    admin.start()
    try:
        port = int(admin.address.rsplit(":", 1)[1])
        assert call("127.0.0.1", port, "POST", "/suspend", {}, "Bearer ")[0] == 401
        assert call("127.0.0.1", port, "POST", "/suspend", {}, None)[0] == 401
    finally:
        admin.stop()
        server.stop()


def test_the_token_is_compared_in_constant_time() -> None:
    from smoosh.daemon.api.http import _Handler

    source = inspect.getsource(_Handler._authorised)
    assert "hmac.compare_digest(" in source
    tree = ast.parse(source.strip())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                     for n in [node.left, *node.comparators]}
            assert not names & {"token", "presented"}, "the token is compared with ==/!= somewhere"


def test_every_msgpack_decode_in_the_sources_sets_explicit_size_limits() -> None:
    limits = {"max_buffer_size", "max_str_len", "max_bin_len", "max_array_len", "max_map_len", "max_ext_len"}
    calls = 0
    for path in python_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("unpackb", "Unpacker", "unpack") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "msgpack":
                calls += 1
                given = {k.arg for k in node.keywords}
                assert given & limits, f"{path}:{node.lineno}: msgpack.{node.func.attr} without size limits"
    assert calls >= 2


def test_the_sources_never_use_pickle_eval_exec_os_system_or_a_shell() -> None:
    found = []
    for path in python_sources():
        text = path.read_text()
        if "pickle" in text:
            found.append(f"{path}: mentions pickle")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in ("pickle", "cPickle", "marshal", "shelve", "dill") for n in names):
                    found.append(f"{path}:{node.lineno}: imports {names}")
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in ("eval", "exec", "compile", "__import__"):
                    found.append(f"{path}:{node.lineno}: {func.id}(")
                if isinstance(func, ast.Attribute) and func.attr in ("system", "popen") \
                        and isinstance(func.value, ast.Name) and func.value.id == "os":
                    found.append(f"{path}:{node.lineno}: os.{func.attr}(")
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        found.append(f"{path}:{node.lineno}: shell=")
        for needle in ("eval(", "exec(", "shell=True", "os.system"):
            for lineno, line in enumerate(text.splitlines(), 1):
                stripped = line.split("#", 1)[0]
                if needle in stripped and not any(ok in stripped for ok in ("literal_eval(", ".exec(", "_exec(")):
                    found.append(f"{path}:{lineno}: {needle}")
    assert found == []
