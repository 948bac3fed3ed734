"""Client pieces without a broker: errors, the route cache, configuration, and direct fragment reads."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker import client
from broker.client import (
    STATUS_ERRORS,
    ClientError,
    ConfigError,
    FragmentReadError,
    JournalClient,
    OffsetJump,
    ProtocolError,
    RouteCache,
    StatusError,
    UnexpectedEOF,
    WrongAppendOffset,
    status_error,
)
from broker.client import config as client_config
from broker.client.fragments import open_fragment_url
from broker.client.routes import primary_endpoint, read_endpoint
from broker.fragment.codecs import compressor
from broker.gateway.responses import rpc_error_text
from broker.protocol import pb
from broker.protocol.rpc_errors import parse_rpc_error_text

# --- Errors ----------------------------------------------------------------------------------


def test_every_non_ok_status_has_an_error_named_after_it() -> None:
    for name, number in pb.Status.items():
        if number == pb.OK:
            continue
        cls = STATUS_ERRORS[number]
        assert cls.__name__ == "".join(part.capitalize() for part in name.split("_"))
        assert issubclass(cls, StatusError) and issubclass(cls, ClientError)
        assert getattr(client, cls.__name__) is cls  # Exported by the package.
        err = status_error(number, journal="a/journal", offset=7)
        assert type(err) is cls and err.status == number
        assert str(err) == f"{name} (journal a/journal, offset 7)"
        assert (err.journal, err.offset) == ("a/journal", 7)


def test_error_texts() -> None:
    assert str(status_error(pb.WRONG_APPEND_OFFSET)) == "WRONG_APPEND_OFFSET"
    assert isinstance(status_error(pb.WRONG_APPEND_OFFSET), WrongAppendOffset)
    with pytest.raises(ProtocolError, match="unknown status 99"):
        status_error(99)
    jump = OffsetJump(journal="j", offset=-1, to=42)
    assert (jump.offset, jump.to) == (-1, 42) and str(jump) == "offset jump to 42 (journal j, offset -1)"


def test_package_exports_what_it_lists() -> None:
    for name in client.__all__:
        assert hasattr(client, name), name


# --- Route cache -------------------------------------------------------------------------------


def route(*members: tuple[str, str, str], primary: int = 0) -> pb.Route:
    return pb.Route(
        members=[pb.ProcessSpec.ID(zone=z, suffix=s) for z, s, _ in members],
        endpoints=[e for _, _, e in members],
        primary=primary,
    )


def test_route_choice_primary_for_appends_same_zone_for_reads() -> None:
    r = route(("east", "a", "http://a:1"), ("west", "b", "http://b:1"), ("west", "c", "http://c:1"), primary=0)
    assert primary_endpoint(r) == "http://a:1"
    assert read_endpoint(r, "west") == "http://b:1"
    assert read_endpoint(r, "north") == "http://a:1"  # No member in the zone: the primary.
    assert primary_endpoint(route(("east", "a", "http://a:1"), primary=-1)) == ""
    assert read_endpoint(route(("east", "a", "http://a:1"), primary=-1), "x") == "http://a:1"
    assert primary_endpoint(pb.Route(members=[pb.ProcessSpec.ID(zone="z", suffix="a")], primary=0)) == ""


def test_route_cache_expires_evicts_and_drops_endpoints() -> None:
    now = [0.0]
    cache = RouteCache(size=2, ttl=10.0, clock=lambda: now[0])
    r = route(("z", "a", "http://a:1"), ("z", "b", "http://b:1"), primary=1)
    cache.update("j/one;meta", r)  # Keyed by journal, without a ;meta suffix.
    assert cache.get("j/one") == r
    cache.update("j/two", r)
    cache.get("j/one")  # Now the most recently used.
    cache.update("j/three", r)
    assert cache.get("j/two") is None and cache.get("j/one") is not None and len(cache) == 2

    cache.drop_endpoint("j/one", "http://b:1")
    dropped = cache.get("j/one")
    assert dropped is not None and list(dropped.endpoints) == ["http://a:1"] and dropped.primary == -1
    cache.drop_endpoint("j/one", "http://a:1")
    assert cache.get("j/one") is None

    now[0] = 11.0
    assert cache.get("j/three") is None  # Expired.
    cache.update("j/four", pb.Route(primary=-1))  # No members: nothing to remember.
    assert cache.get("j/four") is None


def test_journal_client_endpoint_choice() -> None:
    c = JournalClient("http://default:8080", zone="west")
    assert c.endpoint("j", primary=True) == "http://default:8080"
    header = pb.Header(route=route(("east", "a", "http://a:1"), ("west", "b", "http://b:1"), primary=0))
    c.update_route("j", header)
    assert c.endpoint("j", primary=True) == "http://a:1"
    assert c.endpoint("j", primary=False) == "http://b:1"
    c.failed("j", "http://b:1")
    assert c.endpoint("j", primary=False) == "http://a:1"
    c.failed("j", "http://a:1")
    assert c.endpoint("j", primary=False) == "http://default:8080"
    uncached = JournalClient("http://default:8080", route_cache=False)
    uncached.update_route("j", header)
    assert uncached.endpoint("j", primary=True) == "http://default:8080"


# --- Configuration -------------------------------------------------------------------------------


def test_address_precedence_given_env_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolve = client_config.resolve_broker_address
    assert resolve(None, {}) == client_config.DEFAULT_BROKER_ADDRESS == "http://localhost:8080"
    assert resolve(None, {"BROKER_ADDRESS": ""}) == "http://localhost:8080"
    assert resolve(None, {"BROKER_ADDRESS": "http://env:3"}) == "http://env:3"
    assert resolve("http://given:4", {"BROKER_ADDRESS": "http://env:3"}) == "http://given:4"

    # JournalClient uses the same rules when given no address; gazctl's INI files are gazctl's alone.
    monkeypatch.setenv("BROKER_ADDRESS", "http://from-env:9")
    assert JournalClient().address == "http://from-env:9"
    (tmp_path / "gazctl.ini").write_text("[journals.Broker]\nAddress = http://local:2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BROKER_ADDRESS")
    assert JournalClient().address == "http://localhost:8080"


def test_bad_address_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid broker address"):
        JournalClient("localhost:8080")


# --- Direct fragment reads -----------------------------------------------------------------------

CONTENT = b"".join(f"line {i:05d}\n".encode() for i in range(5000))  # 55000 bytes.
BEGIN = 1000


def fragment(codec: int, end: int | None = None) -> pb.Fragment:
    return pb.Fragment(
        journal="a/journal", begin=BEGIN, end=BEGIN + len(CONTENT) if end is None else end, compression_codec=codec
    )


def compressed(codec: int, data: bytes = CONTENT) -> bytes:
    comp = compressor(codec)
    # Several flushes: a gzip file of several members, a snappy or zstd stream of several frames.
    return b"".join(comp.compress(data[i : i + 10000]) for i in range(0, len(data), 10000)) + comp.finish()


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.SNAPPY, pb.ZSTANDARD], ids=pb.CompressionCodec.Name)
async def test_file_fragment_is_decompressed_and_seeked(tmp_path: Path, codec: int) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "frag").write_bytes(compressed(codec))
    reader = await open_fragment_url(fragment(codec), "file:///a/frag", BEGIN + 12345, file_root=str(tmp_path))
    out = b""
    while chunk := await reader.read(7000):
        out += chunk
    assert out == CONTENT[12345:] and reader.offset == BEGIN + len(CONTENT)
    await reader.close()


async def test_file_fragment_errors(tmp_path: Path) -> None:
    (tmp_path / "short").write_bytes(compressed(pb.SNAPPY, CONTENT[:-1]))
    reader = await open_fragment_url(fragment(pb.SNAPPY), "file:///short", BEGIN, file_root=str(tmp_path))
    with pytest.raises(UnexpectedEOF):
        while await reader.read():
            pass
    (tmp_path / "long").write_bytes(CONTENT)
    reader = await open_fragment_url(fragment(pb.NONE, end=BEGIN + 100), "file:///long", BEGIN, file_root=str(tmp_path))
    with pytest.raises(FragmentReadError, match=r"did not read EOF at expected Fragment\.End"):
        await reader.read()
    with pytest.raises(ConfigError, match="pass file_root"):
        await open_fragment_url(fragment(pb.NONE), "file:///long", BEGIN)
    with pytest.raises(FragmentReadError, match="opening"):
        await open_fragment_url(fragment(pb.NONE), "file:///missing", BEGIN, file_root=str(tmp_path))
    (tmp_path / "corrupt").write_bytes(b"not gzip at all")
    with pytest.raises(FragmentReadError, match="gzip"):
        await open_fragment_url(fragment(pb.GZIP), "file:///corrupt", BEGIN + 1, file_root=str(tmp_path))
    # A URL cannot climb out of the file root.
    (tmp_path / "root").mkdir()
    with pytest.raises(FragmentReadError, match="opening"):
        await open_fragment_url(fragment(pb.NONE), "file:///../long", BEGIN, file_root=str(tmp_path / "root"))


class _Store(http.server.BaseHTTPRequestHandler):
    """Serves `objects` by path, recording each request's Accept-Encoding."""

    objects: dict[str, tuple[bytes, str]] = {}
    accept: list[str] = []

    def do_GET(self) -> None:
        _Store.accept.append(self.headers.get("Accept-Encoding", ""))
        path = self.path.split("?", 1)[0]
        if path not in self.objects:
            self.send_error(404)
            return
        body, encoding = self.objects[path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def store() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Store.objects, _Store.accept = {}, []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def read_all(url: str, frag: pb.Fragment, offset: int) -> bytes:
    reader = await open_fragment_url(frag, url, offset)
    out = b""
    while chunk := await reader.read():
        out += chunk
    await reader.close()
    return out


async def test_http_fragment_urls(store: str) -> None:
    _Store.objects = {
        "/gz": (compressed(pb.GZIP), ""),
        "/offload-gzipped": (gzip.compress(CONTENT), "gzip"),  # The store ignored "identity".
        "/offload-plain": (CONTENT, ""),  # The store decompressed for us.
        "/zst": (compressed(pb.ZSTANDARD), ""),
    }
    assert await read_all(f"{store}/gz?X-Amz-Signature=secret", fragment(pb.GZIP), BEGIN + 5) == CONTENT[5:]
    offload = fragment(pb.GZIP_OFFLOAD_DECOMPRESSION)
    assert await read_all(f"{store}/offload-gzipped", offload, BEGIN) == CONTENT
    assert await read_all(f"{store}/offload-plain", offload, BEGIN + 54999) == CONTENT[54999:]
    assert await read_all(f"{store}/zst", fragment(pb.ZSTANDARD), BEGIN) == CONTENT
    assert _Store.accept[:3] == ["gzip", "identity", "identity"]
    with pytest.raises(FragmentReadError, match="!OK fetching") as info:
        await open_fragment_url(fragment(pb.NONE), f"{store}/missing?X-Amz-Signature=secret", BEGIN)
    assert "secret" not in str(info.value)  # Signatures stay out of error texts.


def test_a_get_reads_back_every_grpc_code_the_gateway_writes() -> None:
    """A GET's error text is a gRPC error in grpc-go's words (broker.gateway.responses): the Reader
    takes each back to its code, so a refused token stays fatal and an unreachable peer retried."""
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        err = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="what went wrong")
        assert parse_rpc_error_text(rpc_error_text(err)) == (code, "what went wrong")
