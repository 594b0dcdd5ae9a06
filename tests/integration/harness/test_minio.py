"""The harness runs a real MinIO: aiobotocore uploads in parts and reads ranges back."""

from __future__ import annotations

import hashlib
import os

import pytest
from aiobotocore.session import get_session

pytestmark = pytest.mark.minio
PART = 5 * 1024 * 1024


async def test_multipart_put_and_ranged_get_of_20_mib(s3_server):
    data = os.urandom(20 * 1024 * 1024)
    key = "harness/20mib.bin"
    async with get_session().create_client("s3", **s3_server.client_kwargs()) as s3:
        upload = await s3.create_multipart_upload(Bucket=s3_server.bucket, Key=key)
        parts = []
        for number, start in enumerate(range(0, len(data), PART), start=1):
            answer = await s3.upload_part(
                Bucket=s3_server.bucket,
                Key=key,
                UploadId=upload["UploadId"],
                PartNumber=number,
                Body=data[start : start + PART],
            )
            parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        await s3.complete_multipart_upload(
            Bucket=s3_server.bucket,
            Key=key,
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": parts},
        )
        head = await s3.head_object(Bucket=s3_server.bucket, Key=key)
        assert head["ContentLength"] == len(data)
        assert head["ETag"].strip('"').endswith("-4")  # really stored as 4 parts

        for start, end in [(0, 99), (PART - 10, PART + 10), (len(data) - 4096, len(data) - 1)]:
            answer = await s3.get_object(
                Bucket=s3_server.bucket, Key=key, Range=f"bytes={start}-{end}"
            )
            async with answer["Body"] as body:
                assert await body.read() == data[start : end + 1]

        whole = await s3.get_object(Bucket=s3_server.bucket, Key=key)
        async with whole["Body"] as body:
            digest = hashlib.sha256(await body.read()).hexdigest()
        assert digest == hashlib.sha256(data).hexdigest()
        await s3.delete_object(Bucket=s3_server.bucket, Key=key)
