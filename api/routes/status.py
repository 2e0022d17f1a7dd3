"""GET /: the status page, server-rendered HTML with inline SVG charts; no JavaScript, no build step.

It shows the newest jobs with each signature's state and compile seconds, the caches per toolchain
with their size, and the coverage training runs reported over time. When auth is required it needs a
`read` token like every other read, in the Authorization header. A browser sends no header when it opens
a page, so this one page also takes `?token=`, and only a token whose one scope is `read`: a URL is kept in
the browser's history whatever the logs redact (they do), and a submit or admin token must not be (the page
is sent with no-store and no-referrer so the URL does not travel on).
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from warmup import __version__
from warmup.advise.advice import Advice, AdviceOption
from warmup.api.deps import ServicesDep, authorize, bearer_token
from warmup.api.stats import CacheRow, CoveragePoint, Stats
from warmup.db.records import JobStatus, SignatureStatus
from warmup.db.repository import Repository
from warmup.errors import AuthError
from warmup.formatting import format_duration, short_id
from warmup.job.spec import Spec
from warmup.signature import Signature

router = APIRouter(tags=["status"])
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
MAX_JOBS = 20
MAX_REPORTS = 60
# Jobs whose padding advice the page shows (the newest that can be advised): each costs seconds when not cached.
MAX_ADVISED = 5

# One colour per signature state, shared by every chart and the legend.
STATE_COLORS = {
    "ready": "#2e7d32",
    "running": "#1565c0",
    "queued": "#9e9e9e",
    "failed": "#c62828",
    "missing": "#f9a825",
    "unwarmable": "#6d4c41",  # reported by a run; the job's spec cannot produce it
}


@functools.cache
def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    env.filters["duration"] = lambda s: "-" if s is None else format_duration(s)
    env.filters["bytes"] = human_bytes
    env.filters["when"] = lambda t: "-" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    env.filters["short"] = short_id
    return env


@dataclasses.dataclass(frozen=True)
class JobView:
    status: JobStatus
    title: str  # trainer and model
    toolchain: str
    signatures: list[tuple[str, SignatureStatus]]  # (shape label, status)
    compile_seconds: float
    progress: Markup  # stacked bar of states
    strip: Markup  # one square per signature
    advice: Markup | None = None  # projected job time per padding setting, when the spec can be advised


@router.get("/", response_class=HTMLResponse, summary="Status page", include_in_schema=False)
def status_page(
    request: Request,
    services: ServicesDep,
    token: str | None = Query(None, description="A read-only token, for browsers (or use the header)."),
) -> HTMLResponse:
    header = bearer_token(request)
    authorize(services, header or token, "read")
    if (
        services.settings.auth_required
        and not header
        and token
        and services.token_scopes(token) != frozenset({"read"})
    ):
        raise AuthError(
            "?token= takes a token whose only scope is 'read' (a URL stays in the browser's history): "
            "create one with `warmup token create --scope read`, or send this one in the Authorization header",
            status=403,
        )
    stats: Stats = request.app.state.stats
    repository = services.repository
    summaries = repository.list_jobs(limit=MAX_JOBS)
    statuses = [s for s in (repository.job_status(j.id) for j in summaries) if s is not None]
    labels = stats.toolchain_labels({s.toolchain_key for s in statuses})
    jobs: list[JobView] = []
    for status in statuses:
        spec = _spec(repository, status.spec_key)
        view = _job_view(status, _spec_title(spec, status.spec_key), labels.get(status.toolchain_key, "?"))
        advised = sum(job.advice is not None for job in jobs)
        if spec is not None and advised < MAX_ADVISED:
            advice = services.advice_for_job(spec, status.toolchain_key)
            view = dataclasses.replace(view, advice=advice_chart(advice) if advice else None)
        jobs.append(view)
    caches = stats.caches()
    coverage = stats.coverage(limit=MAX_REPORTS)
    reports, fresh, saved = stats.coverage_totals()
    tasks = stats.tasks()
    html = (
        _environment()
        .get_template("status.html")
        .render(
            version=__version__,
            now=datetime.now(UTC),
            job_states=stats.job_states(),
            queued=sum(n for (_, state), n in tasks.items() if state == "queued"),
            running=sum(n for (_, state), n in tasks.items() if state == "running"),
            workers=sum(stats.workers().values()),
            blobs=stats.blobs(),
            damaged=stats.damaged_blobs(),
            reports=reports,
            fresh=fresh,
            saved=saved,
            jobs=jobs,
            caches=caches,
            cache_chart=cache_chart(caches),
            coverage=list(reversed(coverage[-10:])),
            coverage_chart=coverage_chart(coverage),
            colors=STATE_COLORS,
            advice_colors=ADVICE_COLORS,
        )
    )
    return HTMLResponse(html, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


def _spec(repository: Repository, spec_key: str) -> Spec | None:
    stored = repository.get_spec(spec_key)
    if stored is None:
        return None
    try:
        return Spec.model_validate(stored.data)
    except ValueError:  # stored by an older version whose spec no longer validates
        return None


def _spec_title(spec: Spec | None, spec_key: str) -> str:
    if spec is None:
        return spec_key[:12]
    model = spec.model.rstrip("/").rsplit("/", 2)
    return f"{spec.trainer} · {'/'.join(model[-2:])}"


def _job_view(status: JobStatus, title: str, toolchain: str) -> JobView:
    signatures = sorted(
        ((_shape(s.signature), s) for s in status.signatures), key=lambda pair: _sort_key(pair[1].signature)
    )
    return JobView(
        status=status,
        title=title,
        toolchain=toolchain,
        signatures=signatures,
        compile_seconds=sum(s.compile_seconds or 0.0 for _, s in signatures),
        progress=progress_bar(status.counts),
        strip=signature_strip(signatures),
    )


def _shape(document: dict[str, Any]) -> str:
    try:
        return Signature.model_validate(document).shape_label
    except ValueError:
        return str(document.get("phase", "?"))


def _sort_key(document: dict[str, Any]) -> tuple[str, int, int, int]:
    return (
        str(document.get("phase", "")),
        int(document.get("batch") or 0),
        int(document.get("seq_len") or 0),
        int(document.get("cache_len") or 0),
    )


# --- charts: inline SVG, built here so the page needs nothing but HTML -------------------------------


def progress_bar(counts: dict[str, int], width: int = 240, height: int = 14) -> Markup:
    """A job's signatures as one bar, a segment per state in STATE_COLORS order."""
    total = sum(counts.values()) or 1
    x, parts = 0.0, []
    for state, color in STATE_COLORS.items():
        n = counts.get(state, 0)
        if n:
            w = width * n / total
            parts.append(
                f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" fill="{color}">'
                f"<title>{n} {state}</title></rect>"
            )
            x += w
    return Markup(
        f'<svg class="bar" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(_counts_text(counts))}">{"".join(parts)}</svg>'
    )


def signature_strip(
    signatures: list[tuple[str, SignatureStatus]], size: int = 12, per_row: int = 20
) -> Markup:
    """One square per signature, coloured by state; hover shows the shape and its compile seconds."""
    cells = []
    for index, (label, s) in enumerate(signatures):
        x, y = (index % per_row) * (size + 2), (index // per_row) * (size + 2)
        seconds = f", {s.compile_seconds:.1f} s" if s.compile_seconds is not None else ""
        cells.append(
            f'<rect x="{x}" y="{y}" width="{size}" height="{size}" rx="2" fill="{STATE_COLORS[s.state]}">'
            f"<title>{escape(label)}: {s.state}{seconds}</title></rect>"
        )
    rows = max(1, -(-len(signatures) // per_row))
    width = min(len(signatures), per_row) * (size + 2)
    return Markup(
        f'<svg class="strip" width="{max(width, size)}" height="{rows * (size + 2)}">{"".join(cells)}</svg>'
    )


def cache_chart(caches: list[CacheRow], width: int = 520, bar: int = 18) -> Markup:
    """Horizontal bars: bytes stored per toolchain."""
    if not caches:
        return Markup("")
    largest = max(c.bytes for c in caches) or 1
    label_w, rows = 250, []
    for i, cache in enumerate(caches):
        y = i * (bar + 6)
        w = max(2.0, (width - label_w - 80) * cache.bytes / largest)
        rows.append(
            f'<text x="0" y="{y + bar - 5}" class="label">{escape(_clip(cache.toolchain, 38))}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar}" fill="#5c6bc0">'
            f"<title>{escape(cache.toolchain)}: {cache.entries} entries</title></rect>"
            f'<text x="{label_w + w + 6:.1f}" y="{y + bar - 5}" class="value">{human_bytes(cache.bytes)}</text>'
        )
    height = len(caches) * (bar + 6)
    return Markup(
        f'<svg class="chart" width="{width}" height="{height}" role="img" '
        f'aria-label="cache size per toolchain">{"".join(rows)}</svg>'
    )


def coverage_chart(points: list[CoveragePoint], width: int = 720, height: int = 200) -> Markup:
    """Per training run, oldest to newest: signatures met warm (green) and fresh compiles (red) as
    stacked bars. Runs that compile nothing show a bar that is all green."""
    if not points:
        return Markup(
            '<p class="empty">No coverage reports yet: training runs post them through the callback.</p>'
        )
    top, bottom, left = 10, 30, 40
    plot_h, plot_w = height - top - bottom, width - left - 10
    highest = max(max(p.met - p.missed, 0) + p.fresh_compiles for p in points) or 1
    step = plot_w / len(points)
    bar_w = max(2.0, min(28.0, step * 0.7))
    parts = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 10}" y2="{top + plot_h}" class="axis"/>',
        f'<text x="{left - 6}" y="{top + 10}" class="tick" text-anchor="end">{highest}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" class="tick" text-anchor="end">0</text>',
    ]
    for i, p in enumerate(points):
        x = left + i * step + (step - bar_w) / 2
        warm = max(p.met - p.missed, 0)
        warm_h, fresh_h = plot_h * warm / highest, plot_h * p.fresh_compiles / highest
        y_fresh = top + plot_h - fresh_h
        when = p.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
        tip = f"{when}: {warm} signatures warm, {p.fresh_compiles} fresh compiles, {p.seconds_saved:.0f} s saved"
        parts.append(
            f"<g><title>{escape(tip)}</title>"
            f'<rect x="{x:.1f}" y="{y_fresh:.1f}" width="{bar_w:.1f}" height="{fresh_h:.1f}" fill="{STATE_COLORS["failed"]}"/>'
            f'<rect x="{x:.1f}" y="{y_fresh - warm_h:.1f}" width="{bar_w:.1f}" height="{warm_h:.1f}" fill="{STATE_COLORS["ready"]}"/></g>'
        )
    first, last = points[0].created_at, points[-1].created_at
    parts.append(f'<text x="{left}" y="{height - 8}" class="tick">{first:%Y-%m-%d %H:%M}</text>')
    parts.append(
        f'<text x="{width - 10}" y="{height - 8}" class="tick" text-anchor="end">{last:%Y-%m-%d %H:%M}</text>'
    )
    return Markup(
        f'<svg class="chart" width="{width}" height="{height}" role="img" '
        f'aria-label="fresh compiles per training run over time">{"".join(parts)}</svg>'
    )


def advice_chart(advice: Advice, width: int = 460, bar: int = 12) -> Markup:
    """Projected job time per padding setting, fastest first: compile time then training time, as bars.
    The scale stops at four times the fastest (a setting hours slower is clipped and says so)."""
    options = sorted(advice.options, key=lambda o: o.projected_seconds)
    fastest = options[0].projected_seconds
    scale = min(options[-1].projected_seconds, 4 * fastest) or 1.0
    label_w, value_w = 180, 70
    plot_w = width - label_w - value_w
    rows = []
    for i, option in enumerate(options):
        y = i * (bar + 4)
        label = _advice_label(option)
        if option.current:
            label += " (current)"
        compile_w = min(plot_w, plot_w * option.compile_seconds / scale)
        train_w = min(plot_w - compile_w, plot_w * option.train_seconds / scale)
        clipped = option.projected_seconds > scale
        tip = (
            f"{label}: {len(option.signatures)} signatures, compile {format_duration(option.compile_seconds)}, "
            f"training {format_duration(option.train_seconds)}, padding waste {option.padding_waste:.0%}"
        )
        weight = ' font-weight="bold"' if option is advice.recommended else ""
        rows.append(
            f"<g><title>{escape(tip)}</title>"
            f'<text x="0" y="{y + bar - 2}" class="label"{weight}>{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{compile_w:.1f}" height="{bar}" fill="{ADVICE_COLORS["compile"]}"/>'
            f'<rect x="{label_w + compile_w:.1f}" y="{y}" width="{train_w:.1f}" height="{bar}" '
            f'fill="{ADVICE_COLORS["training"]}"/>'
            f'<text x="{label_w + plot_w + 4}" y="{y + bar - 2}" class="value">'
            f"{'&gt; ' if clipped else ''}{format_duration(option.projected_seconds)}</text></g>"
        )
    height = len(options) * (bar + 4)
    best = advice.recommended
    caption = (
        f"fastest: {_advice_label(best)}, {advice.saving_fraction:.0%} less than the current setting"
        if not best.current
        else "the current setting projects the shortest job"
    )
    return Markup(
        f'<svg class="chart advice" width="{width}" height="{height}" role="img" '
        f'aria-label="projected job time per padding setting; {escape(caption)}">{"".join(rows)}</svg>'
        f"<br><small>{escape(caption)}; from the length histogram: an estimate</small>"
    )


def _advice_label(option: AdviceOption) -> str:
    pad = "none" if option.pad_to_multiple_of is None else option.pad_to_multiple_of
    return f"pad {pad}" + (f", max {option.max_length}" if option.max_length is not None else "")


# Projected time per padding setting: compile time and training time.
ADVICE_COLORS = {"compile": "#8e24aa", "training": "#5c6bc0"}


# --- formatting ---------------------------------------------------------------------------------------


def human_bytes(size: int | float) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in STATE_COLORS if counts.get(s))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
