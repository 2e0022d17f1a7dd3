"""Request and response bodies of the API (the OpenAPI schema documents them)."""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from warmup.advise.data import MAX_TOKENS, LengthsDocument
from warmup.job.spec import Spec
from warmup.signature import Signature
from warmup.toolchain.model import Toolchain

MAX_REPORTED_SIGNATURES = 4096
# The largest integer the database stores (a signed 64-bit column): larger ones are refused with a 422,
# not a 500 from the driver.
DATABASE_INT_MAX = 2**63 - 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        refuse_unstorable(data)
        return data


def refuse_unstorable(data: Any) -> None:
    """Refuse what the database cannot store, wherever it is in a body: PostgreSQL's JSON and text hold
    no NUL character, and JSON no NaN or infinity (they were 500s from the driver)."""
    pending: list[tuple[Any, str]] = [(data, "")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, str) and "\x00" in value:
            raise ValueError(f"{path or 'the body'} contains a NUL character, which no field may hold")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path} is {value}, not a finite number")
        if isinstance(value, dict):
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and "\x00" in key:
                    raise ValueError(f"{where!r} has a NUL character in a field name")
                pending.append((item, where))
        elif isinstance(value, list):
            pending.extend((item, f"{path}.{index}") for index, item in enumerate(value))


class PlanRequest(_Body):
    spec: Spec


class PlannedSignature(Signature):
    """A signature and its key (`key` in JSON; the attribute is not named so, `Signature.key()` is a method)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    signature_key: str = Field(alias="key", description="The signature's key (sha256 of its canonical JSON).")


class PlanResponse(BaseModel):
    spec_key: str
    signatures: list[PlannedSignature]
    warnings: list[str]
    notes: list[str] = Field(
        default_factory=list, description="What the warm-up does differently from the job, and why."
    )
    estimate_seconds: dict[str, float] = Field(description="Estimated compile time of the plan, per backend.")


class WarmupRequest(_Body):
    spec: Spec
    toolchain: Toolchain | None = Field(
        None, description="The environment to warm for (what a pod computes)."
    )
    pool: str | None = Field(
        None, max_length=128, description="Or: a named worker pool; its toolchain is used."
    )
    retry_failed: bool = Field(False, description="Queue again the signatures whose compile failed before.")

    @model_validator(mode="after")
    def _one_target(self) -> WarmupRequest:
        if (self.toolchain is None) == (self.pool is None):
            raise ValueError("give exactly one of toolchain or pool")
        return self


class ManifestRequest(_Body):
    spec: Spec
    toolchain: Toolchain
    allow_partial: bool = Field(
        False, description="Install what exists even if some signatures are not warm yet."
    )


class CoverageRequest(_Body):
    """What a training run met: every signature's key, the ones that compiled fresh, and their documents."""

    spec: Spec
    toolchain: Toolchain
    met: list[str] = Field(default_factory=list, max_length=MAX_REPORTED_SIGNATURES)
    missed: list[Signature] = Field(default_factory=list, max_length=MAX_REPORTED_SIGNATURES)
    fresh_compiles: NonNegativeInt = Field(0, le=DATABASE_INT_MAX)
    details: dict[str, Any] = Field(default_factory=dict)


class CoverageResponse(BaseModel):
    job_id: uuid.UUID
    report_id: int
    enqueued: list[str] = Field(description="Keys of missed signatures that became new tasks.")
    unwarmable: dict[str, str] = Field(
        default_factory=dict,
        description="Missed signatures the job's spec cannot produce, by key: why. They get no task and never "
        "change the job's state.",
    )


class AdviceRequest(_Body):
    """A job and its dataset's per-example lengths: which padding makes the whole job fastest."""

    spec: Spec
    dataset: LengthsDocument | None = Field(
        None, description="Per-example token lengths; without it, an SFT spec's data.length_histogram."
    )
    toolchain: Toolchain | None = Field(
        None, description="Use the compile seconds recorded under this toolchain (else seed figures)."
    )
    pool: str | None = Field(None, max_length=128, description="Or: the toolchain of this worker pool.")
    multiples: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None] | None = Field(
        None, max_length=32, description="Candidate pad_to_multiple_of values (null: no padding)."
    )
    max_truncated: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of the examples an option may cut or drop (0: none)."
    )
    completion_tokens: PositiveInt | None = Field(
        None, le=1 << 20, description="GRPO / RLOO: the assumed length of every completion."
    )
    step_seconds: PositiveFloat | None = Field(
        None,
        description=(
            "Measured seconds of one optimizer step of the job as configured. Default: the mean steady-state "
            "step the job's training runs reported for this toolchain (WarmupCallback), else the seed figures."
        ),
    )

    @model_validator(mode="after")
    def _one_toolchain(self) -> AdviceRequest:
        if self.toolchain is not None and self.pool is not None:
            raise ValueError("give at most one of toolchain or pool")
        return self
