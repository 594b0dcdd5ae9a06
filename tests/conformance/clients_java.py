"""The Java client's runner: Conformance.java, compiled once with the JDK against Kafka's
own jars (.cache/kafka-*/libs) and run as one JVM for the session, one JSON command and
one JSON answer a line, so an op costs no JVM start."""

from __future__ import annotations

import base64
import json
import select
import shutil
import subprocess
from pathlib import Path

from answers import Record, end, error, offset_answer, relative
from ops import Commit, DeleteRecords, Fetch, ListOffsets, Produce, Resume, TxnProduce

from proxy.devstack.paths import kafka_libs

SOURCE = Path(__file__).with_name("Conformance.java")
TIMEOUT_MS = 30_000
_LOG4J2 = "status = error\nrootLogger.level = OFF\n"


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


class Java:
    name = "java"

    def __init__(self, workdir: Path) -> None:
        """Starts compiling at once (the fleet starts meanwhile); the JVM starts on first
        use."""
        self.workdir = workdir
        self.classes = workdir / "classes"
        self.classes.mkdir(parents=True, exist_ok=True)
        self.classpath = f"{kafka_libs()}/*"
        self.stderr_path = workdir / "java.err"
        with open(workdir / "javac.err", "wb") as errors:
            self._javac = subprocess.Popen(
                [shutil.which("javac") or "javac", "-cp", self.classpath, "-d",
                 str(self.classes), str(SOURCE)],
                stdout=subprocess.DEVNULL, stderr=errors,
            )  # fmt: skip
        self.process: subprocess.Popen | None = None

    def _started(self) -> subprocess.Popen:
        if self.process is not None:
            return self.process
        assert self._javac.wait(180) == 0, (self.workdir / "javac.err").read_text()[-3000:]
        log_config = self.workdir / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        with open(self.stderr_path, "wb") as errors:
            self.process = subprocess.Popen(
                [shutil.which("java") or "java", "-Xmx256m", "-XX:+UseSerialGC",
                 "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
                 f"-Dlog4j2.configurationFile={log_config}",
                 "-cp", f"{self.classes}:{self.classpath}", "Conformance"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            )  # fmt: skip
        return self.process

    def close_transactions(self) -> None:
        """The scenario's transactional producers, gone (an open transaction aborted)."""
        if self.process is not None and self.process.poll() is None:
            self._call({"op": "close_transactions"})

    def close(self) -> None:
        if self._javac.poll() is None:
            self._javac.kill()
        self._javac.wait(10)
        if self.process is None:
            return
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def _call(self, command: dict) -> dict:
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(command).encode() + b"\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], 4 * TIMEOUT_MS / 1000)
        line = process.stdout.readline() if ready else b""
        if not line:
            process.kill()
            raise AssertionError(
                f"the Java runner gave no answer to {command['op']}: "
                f"{self.stderr_path.read_text(errors='replace')[-3000:]}"
            )
        answer = json.loads(line)
        assert "fatal" not in answer, f"Java runner, {command['op']}: {answer['fatal']}"
        return answer["answers"]

    def _command(self, op_name: str, bootstrap: str, topics: list[str], zone: str, **more):
        return {"op": op_name, "bootstrap": bootstrap, "topics": topics, "zone": zone,
                "timeout_ms": TIMEOUT_MS, **more}  # fmt: skip

    def produce(self, bootstrap: str, topics: list[str], op: Produce, base_ms: int) -> dict:
        records = _records(op.records, base_ms)
        answers = self._call(
            self._command("produce", bootstrap, topics, op.zone, codec=op.codec, records=records)
        )
        return {t: tuple(answers[t]) for t in topics}

    def txn_produce(self, bootstrap: str, topics: list[str], op: TxnProduce, base_ms: int):
        answers = self._call(
            self._command(
                "txn_produce", bootstrap, topics, op.zone, txn=op.txn, end=op.end,
                codec=op.codec, records=_records(op.records, base_ms),
            )
        )  # fmt: skip
        return {t: tuple(answers[t]) for t in topics}

    def fetch(self, bootstrap: str, topics: list[str], op: Fetch, base_ms: int) -> dict:
        answers = self._call(
            self._command(
                "fetch", bootstrap, topics, op.zone, offset=op.offset, isolation=op.isolation
            )
        )
        return {t: tuple(_fetched(item, base_ms) for item in answers[t]) for t in topics}

    def list_offsets(self, bootstrap: str, topics: list[str], op: ListOffsets, base_ms: int):
        ts = None if op.ts is None else base_ms + op.ts
        answers = self._call(
            self._command(
                "list_offsets",
                bootstrap,
                topics,
                op.zone,
                spec=op.spec,
                ts=ts,
                isolation=op.isolation,
            )  # fmt: skip
        )
        return {t: _offsets(answers[t], base_ms) for t in topics}

    def delete_records(self, bootstrap: str, topics: list[str], op: DeleteRecords, base_ms: int):
        answers = self._call(
            self._command("delete_records", bootstrap, topics, op.zone, offset=op.offset)
        )
        return {
            t: ("low_watermark", a["low_watermark"]) if "error" not in a else error(a["error"])
            for t, a in answers.items()
        }

    def commit(self, bootstrap: str, topics: list[str], op: Commit, group: str, base_ms: int):
        answers = self._call(
            self._command("commit", bootstrap, topics, op.zone, group=group, offset=op.offset)
        )
        return {
            t: ("committed", a["committed"]) if "error" not in a else error(a["error"])
            for t, a in answers.items()
        }

    def resume(self, bootstrap: str, topics: list[str], op: Resume, group: str, base_ms: int):
        answers = self._call(
            self._command("resume", bootstrap, topics, op.zone, group=group, reset=op.reset)
        )
        result = {}
        for topic, a in answers.items():
            if "error" in a:
                result[topic] = error(a["error"])
            elif "end" in a:
                result[topic] = end(a["end"])
            else:
                result[topic] = ("record", a["offset"], _bytes(a["value"]))
        return result


def _records(records, base_ms: int) -> list[dict]:
    return [
        {"key": _b64(r.key), "value": _b64(r.value), "ts": base_ms + r.ts,
         "headers": [[k, _b64(v)] for k, v in r.headers]}
        for r in records
    ]  # fmt: skip


def _fetched(item: dict, base_ms: int):
    if "error" in item:
        return error(item["error"])
    if "end" in item:
        return end(item["end"])
    return Record(
        item["offset"],
        _bytes(item["key"]),
        _bytes(item["value"]),
        relative(item["ts"], base_ms),
        item["ts_type"],
        tuple((k, _bytes(v)) for k, v in item["headers"]),
    )


def _offsets(item: dict, base_ms: int):
    if "error" in item:
        return error(item["error"])
    epoch = item["leader_epoch"]
    return offset_answer(item["offset"], item["ts"], base_ms, None if epoch < 0 else epoch)
