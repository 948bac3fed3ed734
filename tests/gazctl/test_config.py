"""Broker address precedence (flag, env, ./gazctl.ini, ~/.config/gazette/gazctl.ini, default) and dial targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.client import config as client_config
from broker.errors import ConfigError
from gazctl.config import (
    DEFAULT_BROKER_ADDRESS,
    DialTarget,
    dial_target,
    find_ini,
    read_ini_option,
    resolve_broker_address,
)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    (home / ".config" / "gazette").mkdir(parents=True)
    return cwd, home


def write_ini(path: Path, address: str | None, section: str = "journals.Broker") -> None:
    body = f"[{section}]\nAddress = {address}\n" if address is not None else "[other]\nkey = 1\n"
    path.write_text("; gazctl configuration\n" + body)


def local_ini(cwd: Path) -> Path:
    return cwd / "gazctl.ini"


def home_ini(home: Path) -> Path:
    return home / ".config" / "gazette" / "gazctl.ini"


def resolve(flag: str | None, env: dict[str, str], dirs: tuple[Path, Path]) -> str:
    return resolve_broker_address(flag, env, cwd=dirs[0], home=dirs[1])


def test_default_without_flag_env_or_ini(dirs: tuple[Path, Path]) -> None:
    assert resolve(None, {}, dirs) == DEFAULT_BROKER_ADDRESS == "http://localhost:8080"


def test_precedence_flag_env_local_ini_home_ini(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    write_ini(home_ini(home), "http://home:1")
    assert resolve(None, {}, dirs) == "http://home:1"
    write_ini(local_ini(cwd), "http://local:2")
    assert resolve(None, {}, dirs) == "http://local:2"
    env = {"BROKER_ADDRESS": "http://env:3"}
    assert resolve(None, env, dirs) == "http://env:3"
    assert resolve("http://flag:4", env, dirs) == "http://flag:4"


def test_empty_env_is_unset(dirs: tuple[Path, Path]) -> None:
    write_ini(home_ini(dirs[1]), "http://home:1")
    assert resolve(None, {"BROKER_ADDRESS": ""}, dirs) == "http://home:1"


def test_only_the_first_ini_found_is_read(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    write_ini(local_ini(cwd), None)  # Exists, but has no broker address.
    write_ini(home_ini(home), "http://home:1")
    assert find_ini(cwd, home) == local_ini(cwd)
    assert resolve(None, {}, dirs) == DEFAULT_BROKER_ADDRESS


def test_ini_names_match_case_insensitively_and_quotes_are_stripped(dirs: tuple[Path, Path]) -> None:
    path = local_ini(dirs[0])
    path.write_text('[Journals.broker]\naddress = "http://quoted:5"\n[journals.Consumer]\nAddress = http://c:6\n')
    assert read_ini_option(path, "journals.Broker", "Address") == "http://quoted:5"
    assert resolve(None, {}, dirs) == "http://quoted:5"


def test_other_sections_and_keys_are_ignored(dirs: tuple[Path, Path]) -> None:
    path = local_ini(dirs[0])
    path.write_text("[journals.Broker]\nCache.Size = 10\n[journals]\nAddress = http://wrong:1\n")
    assert resolve(None, {}, dirs) == DEFAULT_BROKER_ADDRESS


def test_malformed_ini_names_file_and_line(dirs: tuple[Path, Path]) -> None:
    path = local_ini(dirs[0])
    path.write_text("[journals.Broker]\nAddress = http://a:1\nnot an option line\n")
    with pytest.raises(ConfigError, match=r"gazctl\.ini:3: invalid INI file"):
        resolve(None, {}, dirs)


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("http://localhost:8080", DialTarget("http://localhost:8080", "localhost:8080", tls=False)),
        ("http://127.0.0.1:9000/", DialTarget("http://127.0.0.1:9000/", "127.0.0.1:9000", tls=False)),
        ("http://broker", DialTarget("http://broker", "broker:80", tls=False)),
        ("https://broker.example.com", DialTarget("https://broker.example.com", "broker.example.com:443", tls=True)),
        ("https://b:8443", DialTarget("https://b:8443", "b:8443", tls=True)),
        ("http://[::1]:8080", DialTarget("http://[::1]:8080", "[::1]:8080", tls=False)),
        (
            "unix://localhost/tmp/gazette.sock",
            DialTarget("unix://localhost/tmp/gazette.sock", "unix:///tmp/gazette.sock", tls=False),
        ),
    ],
)
def test_dial_target(address: str, target: DialTarget) -> None:
    assert dial_target(address) == target


@pytest.mark.parametrize("address", ["localhost:8080", "ftp://host:21", "http://", "http://host:port", "unix://host"])
def test_bad_addresses_are_config_errors(address: str) -> None:
    with pytest.raises(ConfigError, match="invalid broker address"):
        dial_target(address)


def test_options_before_any_section_are_allowed(dirs: tuple[Path, Path]) -> None:
    local_ini(dirs[0]).write_text("Zone = local\n[journals.Broker]\nAddress = http://a:1\n")
    assert resolve(None, {}, dirs) == "http://a:1"


def test_gazctl_dials_as_the_client_library_does() -> None:
    assert DialTarget is client_config.DialTarget
    assert dial_target is client_config.dial_target
