"""Logging setup shared by `gazette` and `gazctl`: `--log.level` and `--log.format` (text|json)."""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import StrEnum
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED}


class TextFormatter(logging.Formatter):
    """`time level message key=value ...`, like logrus' text output."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                         for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():5} {record.getMessage()}" + (f" {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        doc.update({k: v if isinstance(v, int | float | bool | str) else str(v)
                    for k, v in _fields(record).items()})
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc)


class LogFormat(StrEnum):
    """Values of `--log.format`; `color` is accepted and prints as `text`."""

    text = "text"
    json = "json"
    color = "color"


LEVELS = ("debug", "info", "warn", "warning", "error", "fatal", "panic")


class ClientMisbehaviour(logging.Filter):
    """What grpcio logs, with a traceback, about a client rather than about us: a client that went
    away while a response was written (logged only if grpcio has not yet seen it go), and request
    metadata that is not UTF-8 (grpcio carries on without it). Each becomes one debug line."""

    BENIGN = ("ExecuteBatchError raised in core by servicer method", "Invalid encoding on ")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("grpc") and str(record.msg).startswith(self.BENIGN):
            if record.msg.startswith("Invalid encoding on "):
                record.msg = "a request's metadata value is not UTF-8: " + record.getMessage()[20:]
            else:
                record.msg = "client went away while a response was written: " + record.getMessage()
            record.args = ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


class StaticFields(logging.Filter):
    """Adds the same fields to every record: the `member=` of a broker whose stderr it shares with
    the other processes of its host (`gazette serve --broker.processes N`)."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            setattr(record, key, value)
        return True


def configure(level: str, fmt: str, fields: dict[str, str] | None = None) -> None:
    """Send logs to stderr at `level` in `fmt`, each line with `fields` (key=value) if given."""
    name = {"warn": "WARNING", "fatal": "CRITICAL", "panic": "CRITICAL"}.get(level.lower(), level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ClientMisbehaviour())
    if fields:
        handler.addFilter(StaticFields(fields))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(name)
    # gRPC, etcd and AWS client internals are noisy at debug level; the AWS SDK also logs, with its
    # traceback, each error it raises to us (a store without credentials, say), which we report.
    for noisy in ("grpc", "aetcd", "asyncio", "botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))
