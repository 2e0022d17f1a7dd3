"""Logging for the service, the workers and the CLI: one line per record, as text, key=value or JSON.

Records carry context fields (task_id, job_id, signature, worker_id ...) set with `log_context(...)`
or passed as `extra=`; the key=value and JSON formats print them as fields. Every format redacts
secrets from the finished line, tracebacks included: bearer tokens, `wu_` API tokens, passwords in
URLs and DSNs, `token=` query parameters and presigned-URL signatures.

The format and level come from the arguments or WARMUP_LOG_FORMAT / WARMUP_LOG_LEVEL.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "kv", "json"]
LOG_FORMATS: tuple[str, ...] = ("text", "kv", "json")
FORMAT_ENV, LEVEL_ENV = "WARMUP_LOG_FORMAT", "WARMUP_LOG_LEVEL"

# Fields a record may carry through log_context() or extra=; printed in this order.
CONTEXT_FIELDS = ("job_id", "task_id", "signature", "worker_id", "toolchain")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "warmup_log_context", default=None
)

REDACTED = "***"
_SECRETS = [
    # Authorization headers and anything else that says "Bearer <token>".
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+"), rf"\1{REDACTED}"),
    # The service's own tokens, wherever they appear.
    (re.compile(r"\bwu_[A-Za-z0-9_-]{8,}"), f"wu_{REDACTED}"),
    # user:password@ in URLs (database URLs, S3 endpoints).
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@"), rf"\1{REDACTED}@"),
    # Query parameters that are credentials: ?token= for the status page, presigned-URL signatures.
    (
        re.compile(
            r"(?i)([?&](?:token|access_token|signature|x-amz-signature|x-amz-security-token|x-amz-credential)=)[^&\s\"']+"
        ),
        rf"\1{REDACTED}",
    ),
    # password=... in libpq DSNs, and AWS secret keys written as key=value.
    (
        re.compile(r"(?i)\b(password|passwd|aws_secret_access_key|secret_key)(\s*[=:]\s*)[^\s&\"',]+"),
        rf"\1\2{REDACTED}",
    ),
]


def redact(text: str) -> str:
    """`text` with every secret the patterns above recognise replaced by ***."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Records logged inside carry these fields (e.g. task_id=12) in the kv and JSON formats."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    found = dict(_context.get() or {})
    for name in CONTEXT_FIELDS:  # extra= wins over the surrounding context
        value = getattr(record, name, None)
        if value is not None:
            found[name] = value
    return {name: found[name] for name in CONTEXT_FIELDS if name in found}


class _Formatter(logging.Formatter):
    def __init__(self, style: LogFormat) -> None:
        super().__init__()
        self.style = style

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        fields = _fields(record)
        if self.style == "json":
            document = {
                "ts": when,
                "level": record.levelname,
                "logger": record.name,
                **fields,
                "msg": message,
            }
            return redact(json.dumps(document, default=str))
        if self.style == "kv":
            pairs = {"ts": when, "level": record.levelname, "logger": record.name, **fields, "msg": message}
            return redact(" ".join(f"{key}={_kv_value(value)}" for key, value in pairs.items()))
        context = " ".join(f"{key}={value}" for key, value in fields.items())
        return redact(
            f"{when} {record.levelname:<7} {record.name}: {message}" + (f" [{context}]" if context else "")
        )


def _kv_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return json.dumps(text)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record comes (a test may have swapped it since)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(fmt: str | None = None, level: str | None = None) -> None:
    """Send every logger (uvicorn's too, when it is started with log_config=None) to stderr in one
    format. Safe to call again: it replaces the handler it installed before."""
    fmt = (fmt or os.environ.get(FORMAT_ENV) or "text").lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    level = (level or os.environ.get(LEVEL_ENV) or "INFO").upper()
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(fmt))  # type: ignore[arg-type]
    handler.set_name("warmup")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "warmup"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
