"""The service's HTTP API, as a pod (or the CLI) calls it: `ServiceClient`, and the transport under it.

HTTP is the standard library's: `urllib.request` for the few API calls (proxies from the environment,
no redirects followed). An answer is read whole, at most a given number of bytes; API errors come
back as the WarmupError the server's `error` code names (`api_error`).
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from typing import Any

from warmup.errors import (
    AuthError,
    NotWarmedError,
    PartlyWarmedError,
    ServerError,
    ServerUnreachableError,
    SpecError,
    ToolchainMismatchError,
    UnsafeArtifactError,
    WarmupError,
)
from warmup.errors import FieldProblem as _FieldProblem
from warmup.manifest import Manifest, parse_manifest
from warmup.retry import RESTART, RETRY_VARIABLE, Backoff, retry_budget_s, retrying

DEFAULT_TIMEOUT_S = 30.0  # per connect and per read, for API calls and blob downloads
CHUNK = 1 << 20
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# A manifest of the largest plan (2048 signatures, tens of files each, presigned URLs) is tens of MiB;
# a larger answer (from the API or the bucket) is refused as it streams in, not read into memory.
MAX_MANIFEST_BYTES = 64 << 20


class ServiceClient:
    """A small typed client of the trl-warmup API. Timeouts are on by default; the token comes from
    the argument or WARMUP_TOKEN and is sent to the service only (never to presigned blob URLs, and
    never along a redirect: none is followed)."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        attempts: int | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        token = token or os.environ.get("WARMUP_TOKEN")
        self.auth_headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        # A call is retried for as long as the service takes to restart, or `attempts` times at most.
        self.backoff = RESTART if attempts is None else Backoff(attempts=attempts)

    def close(self) -> None:
        """Nothing is kept open between API calls; kept for `with ServiceClient(...)`."""

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        max_bytes: int = MAX_MANIFEST_BYTES,
    ) -> Any:
        """One API call with retries on connection errors, 429 and 5xx; API errors become WarmupErrors.
        `body` is sent as JSON; an answer larger than `max_bytes` is refused (UnsafeArtifactError)
        before it is all read. Returns the answer's JSON as parsed (None for an empty answer)."""
        url = f"{self.server}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = {**self.auth_headers, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"

        def call() -> Answer:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            return fetch_answer(request, self.timeout, max_bytes)

        answer = with_retries(call, what=url, backoff=self.backoff)
        if 300 <= answer.status < 400:
            raise ServerError(
                f"{url} answered HTTP {answer.status}, a redirect to {answer.headers.get('Location')}, which is "
                "not followed (it could carry the token elsewhere): give the service's own URL",
                status=answer.status,
            )
        if answer.status >= 400:
            raise api_error(answer)
        return answer.json() if answer.body else None

    def request_object(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        """`request` for an answer that must be a JSON object."""
        return _object(self.request(method, path, body=body), f"{method} {path}")

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request_object("POST", "/v1/plans", body={"spec": spec})

    def submit(
        self,
        spec: dict[str, Any],
        *,
        toolchain: dict[str, Any] | None = None,
        pool: str | None = None,
        retry_failed: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": spec, "retry_failed": retry_failed}
        if toolchain is not None:
            body["toolchain"] = toolchain
        if pool is not None:
            body["pool"] = pool
        return self.request_object("POST", "/v1/warmups", body=body)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.request_object("GET", f"/v1/warmups/{job_id}")

    def jobs(self, *, spec_key: str | None = None, toolchain_key: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("spec_key", spec_key), ("toolchain_key", toolchain_key)) if v}
        return _objects(self.request("GET", "/v1/warmups", params=params), "GET /v1/warmups")

    def manifest(
        self, spec: dict[str, Any], toolchain: dict[str, Any], *, allow_partial: bool = False
    ) -> Manifest:
        body = {"spec": spec, "toolchain": toolchain, "allow_partial": allow_partial}
        try:
            data = self.request("POST", "/v1/manifests", body=body)
        except (ValueError, RecursionError) as error:  # the answer is not JSON (or nested past any parser)
            raise UnsafeArtifactError(f"refusing manifest from {self.server}: not JSON ({error})") from None
        return parse_manifest(data)

    def post_coverage(self, report: dict[str, Any]) -> dict[str, Any]:
        return self.request_object("POST", "/v1/coverage", body=report)

    def coverage(self, job_id: str) -> list[dict[str, Any]]:
        path = f"/v1/warmups/{job_id}/coverage"
        return _objects(self.request("GET", path), f"GET {path}")


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ServerError(
            f"{what} answered {type(value).__name__}, not a JSON object: is this a trl-warmup service?"
        )
    return value


def _objects(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ServerError(
            f"{what} answered something other than a list of JSON objects: is this a trl-warmup service?"
        )
    return value


@dataclass(frozen=True)
class Answer:
    """An HTTP answer read whole: its status, headers (case-insensitive) and body."""

    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class TransportError(OSError):
    """The request did not get an answer: refused, reset, timed out, cut short."""


def fetch_answer(request: urllib.request.Request, timeout: float, max_bytes: int) -> Answer:
    """Send `request` and read its answer (an error status is an answer too), at most `max_bytes`."""
    try:
        try:
            response = opener().open(request, timeout=timeout)
        except urllib.error.HTTPError as error:  # 4xx and 5xx: the answer is read all the same
            response = error
        with response:
            body = bytearray()
            while chunk := response.read(CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    raise UnsafeArtifactError(
                        f"refusing the answer of {request.full_url}: larger than {max_bytes} bytes"
                    )
            return Answer(response.status, response.headers, bytes(body))
    except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
        reason = getattr(error, "reason", error)
        raise TransportError(f"{type(reason).__name__}: {reason}") from error


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is for this API: following it could carry the token
    to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _VerifiedHTTPS(urllib.request.HTTPSHandler):
    """HTTPS verified with the client's CA bundle, loaded on the first HTTPS request only."""

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(http.client.HTTPSConnection, req, context=tls_context())


def opener() -> urllib.request.OpenerDirector:
    """urllib's opener: the environment's proxies (HTTP(S)_PROXY, NO_PROXY), no redirects."""
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies()), _NoRedirects, _VerifiedHTTPS)


def api_error(answer: Answer) -> WarmupError:
    """Turn an API error answer into the matching WarmupError (the server's `error` code decides)."""
    try:
        body = answer.json()
    except (ValueError, RecursionError):
        body = {}
    raw = body.get("detail") if isinstance(body, dict) else None
    detail: dict[str, Any] = (
        raw if isinstance(raw, dict) else {"message": raw if isinstance(raw, str) else answer.text[:500]}
    )
    code = detail.get("error")
    message = str(detail.get("message") or f"HTTP {answer.status}")
    if code == "invalid_spec" or answer.status == 422:
        problems = [
            _FieldProblem(str(p.get("loc", "")), str(p.get("msg", "")))
            for p in _list(detail.get("problems"))
            if isinstance(p, dict)
        ]
        return SpecError(problems or message)
    if code == "not_warmed":
        return NotWarmedError(message)
    if code == "partly_warmed":
        return PartlyWarmedError(_list(detail.get("missing")), message)
    if code == "toolchain_mismatch":
        raw_differences = detail.get("differences")
        differences = {
            str(name): (pair[0], pair[1])
            for name, pair in (raw_differences.items() if isinstance(raw_differences, dict) else ())
            if isinstance(pair, list | tuple) and len(pair) == 2
        }
        return ToolchainMismatchError(differences)
    if answer.status in (401, 403):
        return AuthError(message, status=answer.status)
    return ServerError(f"{message} (HTTP {answer.status})", status=answer.status)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class _RetryableAnswer(Exception):
    """A 429 or 5xx answer, raised so that `retrying` tries again; the last one is returned."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer
        # A service that says when to come back (503 during a database restart) is believed.
        self.retry_after_s = retry_after_s(answer)


def with_retries(call: Callable[[], Answer], *, what: str, backoff: Backoff = RESTART) -> Answer:
    """Retry transient failures (connection errors, 429 and 5xx) with backoff, for as long as the
    service takes to restart (warmup/retry.py)."""

    def answered() -> Answer:
        answer = call()
        if answer.status in RETRYABLE_STATUS:
            raise _RetryableAnswer(answer)
        return answer

    started = time.monotonic()
    try:
        return retrying(
            answered, transient=lambda e: isinstance(e, TransportError | _RetryableAnswer), backoff=backoff
        )
    except _RetryableAnswer as last:
        return last.answer
    except TransportError as error:
        raise ServerUnreachableError(
            f"cannot reach {what} ({error}; retried for {time.monotonic() - started:.0f}s, "
            f"at most {_bound(backoff)}); is the server running and the URL right? (--server / WARMUP_SERVER)"
        ) from None


def _bound(backoff: Backoff) -> str:
    if backoff.attempts < 1000:
        return f"{backoff.attempts} attempts"
    budget = retry_budget_s() if backoff.budget_s is None else backoff.budget_s
    return f"{budget:.0f}s, {RETRY_VARIABLE}"


def retry_after_s(answer: Answer, cap_s: float = 30.0) -> float:
    """Retry-After in seconds (the delta form; an HTTP date counts as absent), at most `cap_s`."""
    try:
        return min(cap_s, max(0.0, float(answer.headers.get("retry-after", 0))))
    except ValueError:
        return 0.0


@functools.cache
def proxies() -> dict[str, str]:
    """The environment's proxies, read once (`proxies.cache_clear()` reads them again)."""
    return urllib.request.getproxies()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """Verified TLS with certifi's CA bundle (SSL_CERT_FILE overrides): slim training
    images often have no system CA bundle."""
    import certifi

    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())


def signature_label(doc: dict[str, Any]) -> str:
    """`train 4x256`, from a signature's document as the API returns it."""
    label = f"{doc.get('phase')} {doc.get('batch')}x{doc.get('seq_len')}"
    return f"{label} cache {doc['cache_len']}" if doc.get("cache_len") else label
