"""Service settings: one class, read from WARMUP_* environment variables or passed in, refusing unsafe values."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything `create_app` needs. Defaults give the embedded setup under `data_dir`."""

    model_config = SettingsConfigDict(env_prefix="WARMUP_", extra="forbid")

    data_dir: Path = Field(
        Path("./data"), description="Embedded default: SQLite file and blob directory here."
    )
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite under data_dir.")
    store_url: str | None = Field(
        None, description="s3://bucket/prefix, or a directory; default under data_dir."
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    auth: Literal["required", "off", "auto"] = Field(
        "auto",
        description="Bearer-token auth: 'auto' requires it unless the server listens on loopback only.",
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies get 413.")
    presign_endpoint_url: str | None = Field(
        None,
        description="S3 endpoint written into presigned blob URLs, where pods reach the store at another "
        "address than this server does; default: the server's own (AWS_ENDPOINT_URL or AWS's).",
    )
    presign_expiry_s: int = Field(
        3600, ge=60, le=7 * 24 * 3600, description="Lifetime of presigned blob URLs."
    )
    lease_s: float = Field(120.0, gt=0, description="Task lease; workers heartbeat well within it.")
    max_signatures: int = Field(2048, ge=1, description="A spec planning more is refused.")
    public_url: str | None = Field(None, description="Base URL pods use to reach this server's blob route.")
    log_format: Literal["text", "kv", "json"] = Field(
        "text", description="Log lines as text, key=value or JSON (secrets are always redacted)."
    )
    log_level: str = Field("INFO", description="Level of the service's logs.")
    metrics_public: bool = Field(
        True,
        description="/metrics answers without a token (aggregate numbers only); false: it needs 'read'.",
    )

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.presign_endpoint_url and not (self.store_url or "").startswith("s3://"):
            raise ValueError(
                "presign_endpoint_url is for an S3 store (store_url s3://bucket/prefix): other stores' "
                "blobs are served by the API's own blob route (public_url)"
            )
        if self.presign_endpoint_url and not self.presign_endpoint_url.startswith(("http://", "https://")):
            raise ValueError(f"presign_endpoint_url {self.presign_endpoint_url!r} is not an http(s) URL")
        if self.auth == "off" and not is_loopback(self.host):
            raise ValueError(
                f"auth 'off' while listening on {self.host}: anyone on the network could submit work and read "
                "caches; use auth 'required' (the default off loopback) or listen on 127.0.0.1"
            )
        return self

    @property
    def auth_required(self) -> bool:
        if self.auth == "auto":
            return not is_loopback(self.host)
        return self.auth == "required"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'warmup.db').resolve()}"

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or str((self.data_dir / "blobs").resolve())
