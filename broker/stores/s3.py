"""The `s3://bucket/prefix/` store, via boto3 (blocking calls run in threads).

Query arguments as in Gazette: `endpoint` (forces path-style addressing), `profile`,
`region`, `ACL`, `storageClass`, `SSE`, `SSEKMSKeyId`, `find`, `replace`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

import boto3
import botocore.config
import botocore.exceptions

from broker.stores.base import StoreError, StoreObject, bucket_and_prefix, query_args, rewrite

ARGS = {"endpoint", "profile", "region", "ACL", "storageClass", "SSE", "SSEKMSKeyId", "find", "replace"}
READ_CHUNK = 1 << 20


class S3Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.bucket, self.prefix = bucket_and_prefix(url)
        self._args = query_args(url, ARGS)
        session = boto3.session.Session(profile_name=self._args.get("profile") or None)
        config = botocore.config.Config(
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
            s3={"addressing_style": "path"} if self._args.get("endpoint") else None,
        )
        self._client: Any = session.client(
            "s3",
            endpoint_url=self._args.get("endpoint") or None,
            region_name=self._args.get("region") or None,
            config=config,
        )

    def _key(self, path: str) -> str:
        return self.prefix + rewrite(path, self._args)

    async def _call(self, path: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, **kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(str(exc), self.url, path) from exc

    async def list(self, prefix: str) -> list[StoreObject]:
        def walk() -> list[StoreObject]:
            out = []
            top = self._key(prefix)
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=top)
            for page in pages:
                for obj in page.get("Contents", []):
                    key: str = obj["Key"]
                    if key.endswith("/"):
                        continue
                    out.append(StoreObject(key[len(top):], int(obj["LastModified"].timestamp())))
            return out

        try:
            return await asyncio.to_thread(walk)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(str(exc), self.url, prefix) from exc

    async def exists(self, path: str) -> bool:
        try:
            await asyncio.to_thread(self._client.head_object, Bucket=self.bucket, Key=self._key(path))
            return True
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise StoreError(str(exc), self.url, path) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StoreError(str(exc), self.url, path) from exc

    async def put(self, path: str, source: BinaryIO, content_encoding: str = "") -> None:
        extra: dict[str, str] = {"ACL": self._args.get("ACL") or "bucket-owner-full-control"}
        for arg, key in (("storageClass", "StorageClass"), ("SSE", "ServerSideEncryption"),
                         ("SSEKMSKeyId", "SSEKMSKeyId")):
            if self._args.get(arg):
                extra[key] = self._args[arg]
        if content_encoding:
            extra["ContentEncoding"] = content_encoding
        await self._call(path, self._client.upload_fileobj, Fileobj=source, Bucket=self.bucket,
                         Key=self._key(path), ExtraArgs=extra)

    async def open(self, path: str) -> AsyncIterator[bytes]:
        resp = await self._call(path, self._client.get_object, Bucket=self.bucket, Key=self._key(path))
        body = resp["Body"]
        try:
            while chunk := await asyncio.to_thread(body.read, READ_CHUNK):
                yield chunk
        finally:
            body.close()

    async def sign_get(self, path: str, ttl: float) -> str:
        url: str = await self._call(
            path, self._client.generate_presigned_url, ClientMethod="get_object",
            Params={"Bucket": self.bucket, "Key": self._key(path)}, ExpiresIn=max(1, int(ttl)),
        )
        return url

    async def remove(self, path: str) -> None:
        await self._call(path, self._client.delete_object, Bucket=self.bucket, Key=self._key(path))
