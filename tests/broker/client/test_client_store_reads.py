"""Direct reads of fragments persisted to object stores (s3:// on moto, gs:// on fake-gcs-server, azure://
on Azurite): the Reader GETs the signed URLs itself. fake-gcs-server does not check V4 signatures;
Azurite checks SAS ones, and moto presigned S3 ones."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from broker.client import JournalClient, RetryReader, append, fragments_request, list_all_fragments
from broker.protocol import pb
from tests.support.harness import BrokerProcess
from tests.support.journals import metric, new_journal
from tests.support.store_emulators import EmulatorProcess, emulator_of

RECORD = 1500


SIGNATURE = {"s3": "Signature=", "gs": "X-Goog-Signature=", "azure": "sig="}
"""What each store's signed URLs carry their signature in."""


@pytest.mark.parametrize("scheme", ["s3", "gs", "azure"])
@pytest.mark.parametrize("codec", [pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION], ids=pb.CompressionCodec.Name)
async def test_do_not_proxy_reads_signed_store_urls(
    store_broker: BrokerProcess, emulators: dict[str, EmulatorProcess | str], scheme: str, codec: int
) -> None:
    emulator = emulator_of(emulators, scheme)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(emulator.create_bucket, bucket)
    async with JournalClient(store_broker.url) as client:
        journal = await new_journal(
            client, f"client/{scheme}", length=1024, compression_codec=codec, stores=[emulator.store_url(bucket)],
            refresh_interval=1,
        )
        records = [bytes([65 + i]) * RECORD for i in range(3)]
        for r in records:
            await append(client, journal, r)
        async with asyncio.timeout(30):
            while len([f for f in (await list_all_fragments(client, fragments_request(journal))).fragments
                       if f.spec.backing_store]) < 2:
                await asyncio.sleep(0.1)
        before = await asyncio.to_thread(metric, store_broker, "gazette_read_bytes_total", journal)

        reader = RetryReader(client, journal, do_not_proxy=True)
        assert await reader.read(10) == records[0][:10]
        assert reader.reader.fragment_url.startswith(emulator.endpoint)
        assert SIGNATURE[scheme] in reader.reader.fragment_url
        rest = b"".join([chunk async for chunk in reader])
        assert records[0][:10] + rest == b"".join(records)
        served = await asyncio.to_thread(metric, store_broker, "gazette_read_bytes_total", journal) - before
        assert served <= RECORD  # At most the last, unpersisted fragment came through the broker.
        await reader.close()

