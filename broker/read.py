"""Serving a Read RPC from a local replica: metadata frames, then content, fragment by fragment."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from broker.fragment import Fragment
from broker.protocol import pb
from broker.replica import Replica

# Content frames are up to 1 MiB: Gazette's 32736-byte frames cost more per byte than Python's
# gRPC can afford (measured by tests/benchmarks/bench_broker.py), and every gRPC client accepts
# 4 MiB messages by default.
CHUNK_SIZE = 1 << 20
# Opens a persisted fragment at an offset as a stream of decompressed bytes.
RemoteOpener = Callable[[Fragment, int], AsyncIterator[bytes]]
# Signs a GET URL of a persisted fragment for the given TTL in seconds.
URLSigner = Callable[[Fragment, float], Awaitable[str]]
READ_URL_TTL = 60.0


async def serve_read(
    req: pb.ReadRequest,
    header: pb.Header,
    replica: Replica,
    open_remote: RemoteOpener | None = None,
    sign_url: URLSigner | None = None,
    on_content: Callable[[int], object] = lambda _n: None,
) -> AsyncIterator[pb.ReadResponse]:
    """Yield the responses of `req` against `replica`'s index until done (or forever, if blocking).

    `on_content` is told the length of each content frame (reading it back out of a response
    would copy it).
    """
    offset = req.offset
    first = True
    while True:
        result = await replica.index.query(offset, req.block, req.begin_mod_time)
        resp = pb.ReadResponse(status=result.status, offset=result.offset, write_head=result.write_head)
        if first:
            resp.header.CopyFrom(header)
            first = False
        fragment = result.fragment
        if fragment is not None:
            resp.fragment.CopyFrom(fragment.spec)
            if not fragment.is_local and sign_url is not None:
                resp.fragment_url = await sign_url(fragment, READ_URL_TTL)
        yield resp

        offset = result.offset
        if (
            result.status != pb.OK
            or fragment is None
            or req.metadata_only
            or (not fragment.is_local and req.do_not_proxy)
            or (req.end_offset != 0 and offset >= req.end_offset)
        ):
            return
        end = fragment.end if req.end_offset == 0 else min(fragment.end, req.end_offset)
        if fragment.file is not None:
            while offset < end:
                n = min(CHUNK_SIZE, end - offset)
                data = fragment.file.read_at(offset - fragment.begin, n)
                on_content(len(data))
                yield pb.ReadResponse(offset=offset, content=data)
                offset += len(data)
        else:
            if open_remote is None:
                raise RuntimeError(f"no store can open fragment {fragment.spec.backing_store}")
            async for data in open_remote(fragment, offset):
                data = data[: end - offset]
                for i in range(0, len(data), CHUNK_SIZE):
                    frame = data[i : i + CHUNK_SIZE]
                    on_content(len(frame))
                    yield pb.ReadResponse(offset=offset + i, content=frame)
                offset += len(data)
                if offset >= end:
                    break
        if req.end_offset != 0 and offset >= req.end_offset:
            return
