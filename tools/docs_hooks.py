"""mkdocs hooks (mkdocs.yml `hooks:`): the Reference pages, generated from the code at every build, and
checks that hold the hand-written pages to the code.

Generated (never written to disk, so they cannot drift): the command line from the real argparse parsers
(warmup.cli.build_parser), the settings from warmup.settings.Settings, the exit codes from warmup.errors
(and the HTTP status the API maps each to), the HTTP API from the app's OpenAPI schema, the metrics from
the collectors /metrics serves, the log fields from warmup.logs, the Python API from `warmup.__all__`
(rendered by mkdocstrings).

Checked on every page, README.md and CONTRIBUTING.md (a warning, so `mkdocs build --strict` fails): every
`warmup COMMAND --option` written in code is a command and option of the real parser, every WARMUP_*
variable named is one the code reads, every `from warmup import NAME` names a public name.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import re
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.reference")
REPO = Path(__file__).resolve().parents[1]
# Pages outside docs/ held to the same checks.
CHECKED_OUTSIDE = ["README.md", "CONTRIBUTING.md"]


def _cell(text: Any) -> str:
    """Text for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: Any) -> str:
    return f"`{text}`" if "`" not in str(text) else f"`` {text} ``"


# --- the command line ---------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from warmup.cli import build_parser

    # Some defaults come from the environment (WARMUP_SERVER): the page shows the code's, not this shell's.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("WARMUP_")}
    try:
        return build_parser()
    finally:
        os.environ.update(saved)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the parser's order."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def _commands(
    parser: argparse.ArgumentParser, prefix: str = "warmup"
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for name, help_text, sub in _subcommands(parser):
        yield f"{prefix} {name}", help_text, sub
        yield from _commands(sub, f"{prefix} {name}")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if (
            isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
            or action.help == argparse.SUPPRESS
        ):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or (
                    "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
                )
                name += f" {metavar if isinstance(metavar, str) else ' '.join(metavar)}"
        else:
            name = action.metavar if isinstance(action.metavar, str) else action.dest
        help_text = formatter._expand_help(action) if action.help else ""
        notes = []
        if action.required and action.option_strings:
            notes.append("required")
        if isinstance(action, argparse._AppendAction):
            notes.append("repeatable")
        if action.default not in (None, False, argparse.SUPPRESS, []) and action.nargs != 0:
            notes.append(f"default {_code(action.default)}")
        rows.append(f"| {_code(name)} | {_cell(help_text)} | {_cell('; '.join(notes))} |")
    return rows


def cli_page() -> str:
    parser = _parser()
    lines = [
        "# Command line",
        "",
        "Generated from the `warmup` command's own argparse parsers at every docs build; `warmup COMMAND --help`",
        "prints the same. Options of `serve`, `worker`, `token` and `gc` come from the [settings](settings.md):",
        "each also reads its `WARMUP_*` variable.",
        "",
        "| command | what |",
        "|---|---|",
    ]
    commands = list(_commands(parser))
    for name, help_text, _ in commands:
        anchor = name.replace(" ", "-")
        lines.append(f"| [`{name}`](#{anchor}) | {_cell(help_text)} |")
    for name, help_text, sub in commands:
        anchor = name.replace(" ", "-")
        usage = sub.format_usage().removeprefix("usage: ").rstrip()
        lines += ["", f"## {name} {{#{anchor}}}", "", help_text[:1].upper() + help_text[1:] + ".", ""]
        if sub.description:
            lines += [" ".join(sub.description.split()), ""]
        lines += ["```", usage, "```", ""]
        rows = _option_rows(sub)
        if rows:
            lines += ["| argument | what | |", "|---|---|---|", *rows]
    return "\n".join(lines) + "\n"


# --- settings -----------------------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    """`int`, `path`, `one of: a, b`, `text, optional` ... for a settings field's annotation."""
    import types
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1
    if optional:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Literal:
        name = "one of " + ", ".join(map(str, typing.get_args(annotation)))
    elif typing.get_origin(annotation) is tuple:
        name = "comma-separated numbers"
    else:
        name = {str: "text", int: "integer", float: "number", bool: "true/false", Path: "path"}.get(
            annotation, str(annotation)
        )
    return name + (", optional" if optional else "")


def settings_page() -> str:
    from warmup.settings import Settings, _option, flag_of

    lines = [
        "# Settings",
        "",
        "Generated from `warmup.settings.Settings` at every docs build. Every setting of `warmup serve`,",
        "`warmup worker`, `warmup token` and `warmup gc` is read from its command-line option, else its",
        "`WARMUP_*` environment variable, else its default; the settings without an option are read from",
        "their variable only. Unsafe combinations are refused at start-up, naming the setting. S3",
        "credentials, region and endpoint come from the standard `AWS_*` variables (`AWS_ENDPOINT_URL`;",
        "`AWS_DEFAULT_REGION` for boto3).",
        "",
        "| variable | option (commands) | type | default | what |",
        "|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        option = _option(name)
        flag = f"`{flag_of(name)}` ({', '.join(option.commands)})" if option else "variable only"
        default = field.default
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        elif isinstance(default, Path):
            default = f"./{default}"
        bounds = [
            f"{word} {getattr(m, word)}"
            for m in field.metadata
            for word in ("ge", "gt", "le", "lt")
            if getattr(m, word, None) is not None
        ]
        what = field.description or ""
        if bounds:
            what += f" ({', '.join(bounds).replace('ge ', '>= ').replace('le ', '<= ').replace('gt ', '> ')})"
        lines.append(
            f"| `WARMUP_{name.upper()}` | {flag} | {_type_name(field.annotation)} | "
            f"{_code(default) if default is not None else 'none'} | {_cell(what)} |"
        )
    return "\n".join(lines) + "\n"


# --- exit codes and errors ----------------------------------------------------------------------------


def _example(cls: type[Any]) -> Any:
    """An instance, to ask the API which HTTP status it maps to."""
    from warmup import errors

    special: dict[type[Any], Any] = {
        errors.ToolchainMismatchError: lambda: cls({}),
        errors.JobNotFoundError: lambda: cls(1),
        errors.LeaseLostError: lambda: cls(1, "w"),
        errors.PartlyWarmedError: lambda: cls([]),
    }
    for base, build in special.items():
        if issubclass(cls, base):
            return build()
    return cls("example")


def _error_classes() -> list[type[Any]]:
    from warmup.errors import WarmupError

    found: list[type[Any]] = []

    def walk(cls: type[Any]) -> None:
        found.append(cls)
        for sub in cls.__subclasses__():
            if sub.__module__ == "warmup.errors":
                walk(sub)

    walk(WarmupError)
    return found


def exit_codes_page() -> str:
    from warmup.api.errors import _answer
    from warmup.cli.submit import EXIT_TIMEOUT

    lines = [
        "# Exit codes and errors",
        "",
        "Every error a user can cause is a `WarmupError` (`warmup/errors.py`): the command line prints its",
        "message as one line (`error: ...`, no traceback) and exits with its code; the API answers with its",
        'HTTP status and a body `{"detail": {"error": CODE, "message": ...}}`. Generated from the classes',
        "at every docs build.",
        "",
        "## The command's exit status",
        "",
        "| status | meaning |",
        "|---|---|",
        "| 0 | done (for `warmup submit --wait`: every signature is warm) |",
        "| 1 | an error with no code of its own (the errors below marked 1), or a `warmup selftest` phase failed |",
        "| 2 | an invalid spec or config (every problem listed with its field), or a command line argparse refuses |",
        "| 3 | not warm yet, partly warm, a warm-up that failed, a background pull that failed, a strict run that met an unwarmed shape; a `warmup worker` whose task failed |",
        f"| {EXIT_TIMEOUT} | `warmup submit --wait`: the warm-up did not finish within `--timeout` |",
        "| 130 | interrupted (Ctrl-C) |",
        "",
        "## The errors",
        "",
        "| error | exit status | HTTP status (API code) | what |",
        "|---|---|---|---|",
    ]
    for cls in _error_classes():
        status, body = _answer(_example(cls))
        doc = " ".join((inspect.getdoc(cls) or "").split())
        lines.append(
            f"| `{cls.__name__}` | {cls.exit_code} | {status} (`{body['detail']['error']}`) | {_cell(doc)} |"
        )
    lines += [
        "",
        "The API also answers 503 `database_unavailable` with `Retry-After` while its database is unreachable,",
        "413 for a body over `WARMUP_MAX_BODY_BYTES`, and 422 `invalid_spec` for a request that does not",
        "validate (each problem with its field path).",
    ]
    return "\n".join(lines) + "\n"


# --- the HTTP API -------------------------------------------------------------------------------------


def _app() -> Any:
    from warmup.api.app import create_app
    from warmup.settings import Settings

    return create_app(Settings(data_dir=Path(tempfile.gettempdir()) / "warmup-docs", host="127.0.0.1"))


def _api_routes(routes: list[Any]) -> Iterator[Any]:
    """Every APIRoute, through the routers the app includes."""
    from fastapi.routing import APIRoute

    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        router = getattr(route, "original_router", None)  # an included router (FastAPI >= 0.120)
        if router is not None:
            yield from _api_routes(router.routes)


# Routes that take no token by design (their own rules are in the page's lead).
OPEN_ROUTES = {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")}


def _route_scopes(app: Any, operations: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(method, path) -> the token scopes a route's `require(...)` dependency accepts."""
    scopes = {}
    for route in _api_routes(app.routes):
        for dependency in route.dependencies:
            names = inspect.getclosurevars(dependency.dependency).nonlocals
            if "scope" in names:
                wanted = " or ".join((names["scope"], *names.get("others", ())))
                for method in route.methods:
                    scopes[(method.lower(), route.path)] = wanted
    unexplained = sorted(set(operations) - set(scopes) - OPEN_ROUTES)
    if unexplained:
        raise RuntimeError(f"docs: no token scope found for {unexplained} (api/deps.py require changed?)")
    return scopes


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key])
    if "const" in schema:
        return _code(json.dumps(schema["const"]))
    if "enum" in schema:
        return " \\| ".join(_code(json.dumps(v)) for v in schema["enum"])
    if schema.get("type") == "object" and "additionalProperties" in schema:
        inner = schema["additionalProperties"]
        return f"object of {_schema_name(inner) if isinstance(inner, dict) else 'any'}"
    return schema.get("type", "any")


def http_api_page() -> str:
    app = _app()
    schema = app.openapi()
    lines = [
        "# HTTP API",
        "",
        f"Generated from the service's OpenAPI schema ({schema['info']['title']} {schema['info']['version']}) at",
        "every docs build; a running server serves the same schema at `/openapi.json` and its interactive",
        "docs at `/docs`. Off loopback every route but the health checks and `/metrics` needs a bearer token",
        "(`Authorization: Bearer ...`) with the scope named ([tokens](../how-to/tokens.md)); `/metrics` needs",
        "`read` when `WARMUP_METRICS_PUBLIC` is false. `GET /` is the status page (HTML, `read`).",
        "",
        "| method | path | scope | what |",
        "|---|---|---|---|",
    ]
    operations = [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    ]
    scopes = _route_scopes(app, [(method, path) for path, method, _ in operations])
    for path, method, operation in operations:
        anchor = operation["operationId"].lower()
        lines.append(
            f"| {method.upper()} | [`{path}`](#{anchor}) | {scopes.get((method, path), 'none')} | "
            f"{_cell(operation.get('summary', ''))} |"
        )
    for path, method, operation in operations:
        anchor = operation["operationId"].lower()
        lines += [
            "",
            f"## {method.upper()} {path} {{#{anchor}}}",
            "",
            f"**{operation.get('summary', '')}.**",
            "",
        ]
        if operation.get("description"):
            lines += [operation["description"].strip(), ""]
        lines += [f"Scope: {scopes.get((method, path), 'none')}.", ""]
        parameters = operation.get("parameters", [])
        if parameters:
            lines += ["| parameter | in | type | required | what |", "|---|---|---|---|---|"]
            for parameter in parameters:
                lines.append(
                    f"| `{parameter['name']}` | {parameter['in']} | {_schema_name(parameter.get('schema', {}))} | "
                    f"{'yes' if parameter.get('required') else 'no'} | "
                    f"{_cell(parameter.get('description', parameter.get('schema', {}).get('description', '')))} |"
                )
            lines.append("")
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            lines += [f"Request body: {_schema_name(body['schema'])}.", ""]
        lines += ["| status | what | body |", "|---|---|---|"]
        for status, response in operation.get("responses", {}).items():
            content = response.get("content", {})
            kind = next(iter(content), "")
            shape = _schema_name(content[kind].get("schema", {})) if kind == "application/json" else kind
            lines.append(f"| {status} | {_cell(response.get('description', ''))} | {shape} |")
    lines += ["", "## Schemas", ""]
    for name, component in sorted(schema.get("components", {}).get("schemas", {}).items()):
        lines += [f"### {name} {{#{name.lower()}}}", ""]
        if component.get("description"):
            lines += [_cell(component["description"]), ""]
        properties = component.get("properties", {})
        if properties:
            required = set(component.get("required", []))
            lines += ["| field | type | required | what |", "|---|---|---|---|"]
            for field, spec in properties.items():
                lines.append(
                    f"| `{field}` | {_schema_name(spec)} | {'yes' if field in required else 'no'} | "
                    f"{_cell(spec.get('description', ''))} |"
                )
        elif "enum" in component:
            lines.append(f"One of {_schema_name(component)}.")
        lines.append("")
    return "\n".join(lines) + "\n"


# --- metrics and logs ---------------------------------------------------------------------------------


def metrics_page() -> str:
    from warmup.api.routes.metrics import DatabaseCollector, Metrics
    from warmup.api.stats import Stats
    from warmup.db.engine import make_engine
    from warmup.db.migrate import upgrade

    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{folder}/metrics.db")
        upgrade(engine)
        stats = Stats(engine)
        # Every family the scrape serves, from the collectors themselves (not from a scrape, which would
        # hide a family whose query failed behind warmup_database_up 0).
        collector = DatabaseCollector(lambda: stats)
        families = [next(iter(collector.collect())), *collector._families(stats)]
        engine.dispose()
    pulls = Metrics(lambda: stats).pulls
    rows = [
        (
            f.name + ("_total" if f.type == "counter" else ""),
            f.type,
            getattr(f, "_labelnames", ()),
            f.documentation,
            "database",
        )
        for f in families
    ]
    rows.append((pulls._name + "_total", "counter", pulls._labelnames, pulls._documentation, "this process"))
    lines = [
        "# Metrics",
        "",
        "`GET /metrics`, Prometheus text format. Generated from the collectors `/metrics` serves",
        "(`api/routes/metrics.py`) at every docs build. Metrics read from the database at scrape time are the",
        "same on every API replica: aggregate them with `max`. Those counted in each API process: `sum` them.",
        "Blob downloads that go straight to S3 through presigned URLs do not pass through the API and are not",
        "counted.",
        "",
        "| metric | type | labels | counted | what |",
        "|---|---|---|---|---|",
    ]
    for name, kind, labels, documentation, where in rows:
        lines.append(
            f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels) or ''} | {where} | {_cell(documentation)} |"
        )
    return "\n".join(lines) + "\n"


def logs_page() -> str:
    from warmup import logs

    record = logging.LogRecord(
        "warmup.worker", logging.INFO, __file__, 1, "task done in %.1f s", (12.5,), None
    )
    for name in logs.CONTEXT_FIELDS:
        setattr(record, name, {"job_id": "8d0c...", "task_id": 12, "signature": "3f9a1c2b7d4e",
                               "worker_id": "host-1:4242", "toolchain": "inductor/cpu"}.get(name, "..."))  # fmt: skip
    record.created = 1767225600.0  # a fixed time, so the page does not change between builds
    examples = []
    for style in logs.LOG_FORMATS:
        examples += [
            f"`WARMUP_LOG_FORMAT={style}`:",
            "",
            "```",
            logs._Formatter(style).format(record),
            "```",
            "",
        ]  # type: ignore[arg-type]
    lines = [
        "# Log fields",
        "",
        "The server, the workers and `warmup gc` log one line per record; uvicorn's access log goes through",
        "the same formatter. Generated from `warmup/logs.py` at every docs build.",
        "",
        "Formats (`WARMUP_LOG_FORMAT`): "
        + ", ".join(f"`{s}`" for s in logs.LOG_FORMATS)
        + "; level: `WARMUP_LOG_LEVEL`.",
        "",
        "Every line has `ts`, `level`, `logger` and `msg`; these context fields follow when the record has them,",
        "in this order:",
        "",
        "| field | set on |",
        "|---|---|",
    ]
    where = {
        "job_id": "a worker's lines about a job's manifest",
        "task_id": "everything a worker logs while it works on a task",
        "signature": "the same, the first 12 characters of the signature's key",
        "worker_id": "the same",
        "toolchain": "a record given it (`log_context(...)` or `extra=`)",
    }
    for name in logs.CONTEXT_FIELDS:
        lines.append(f"| `{name}` | {where.get(name, '')} |")
    lines += ["", "One record in each format:", "", *examples, "## Redaction", ""]
    lines.append((logs.__doc__ or "").split("\n\n")[1].replace("\n", " ") if logs.__doc__ else "")
    return "\n".join(lines) + "\n"


# --- the Python API -----------------------------------------------------------------------------------


def python_api_page() -> str:
    import warmup

    lines = [
        "# Python API",
        "",
        "The public surface is `warmup.__all__`: import these names from `warmup` (`from warmup import",
        "WarmupCallback, pull`); the modules they are defined in are internals that may move. Each name loads",
        "on first use, so `import warmup` in a training pod imports nothing heavy. Generated from",
        "`warmup.__all__` at every docs build.",
        "",
    ]
    for name in warmup.__all__:
        module, attribute = warmup._EXPORTS[name]
        lines += [
            f"## `warmup.{name}` {{#{name.lower()}}}",
            "",
            f"::: {module}.{attribute}",
            "    options:",
            "      show_root_heading: true",
            "      show_root_toc_entry: false",
            "      show_root_full_path: false",
            "      heading_level: 3",
            "",
        ]
    return "\n".join(lines)


PAGES = {
    "reference/cli.md": cli_page,
    "reference/settings.md": settings_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/http-api.md": http_api_page,
    "reference/metrics.md": metrics_page,
    "reference/logs.md": logs_page,
    "reference/python-api.md": python_api_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, build in PAGES.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=build()))
    return files


# --- the checks ---------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
ENV_NAME = re.compile(r"(?<!secrets\.)(?<!vars\.)\bWARMUP_[A-Z][A-Z0-9_]*\b")
FROM_WARMUP = re.compile(r"^\s*from warmup import ([\w, ()]+)$", re.M)
# A path in the repository, as pages cite code, tests and deployment files.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:warmup|api|worker|tests|benchmarks|tools|docker|examples|migrations|docs)/[\w./-]*[\w/])"
    r"(?![\w./<*{-])"
)
# Paths the pages cite in other projects' repositories (TRL, optimum-neuron, torch-neuronx), not in this one.
EXTERNAL_PATHS = {
    "examples/cli_configs/example_config.yaml",
    "docs/source/guides/cache_system.mdx",
    "tests/cache/test_persistent_caching_e2e.py",
}


def _known_variables() -> set[str]:
    from warmup.settings import Settings

    found = {f"WARMUP_{name.upper()}" for name in Settings.model_fields}
    for folder in ("warmup", "api", "worker", "tests", "docker"):
        for path in (REPO / folder).rglob("*"):
            if (
                path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".sbatch", ".sh", "")
            ) or path.name.endswith("Dockerfile"):
                try:
                    found |= set(ENV_NAME.findall(path.read_text(errors="replace")))
                except (IsADirectoryError, OSError):
                    continue
    return found


class _Checker:
    def __init__(self) -> None:
        parser = _parser()
        self.commands: dict[str, argparse.ArgumentParser] = {name: sub for name, _, sub in _commands(parser)}
        self.variables = _known_variables()
        import warmup

        self.public = set(warmup.__all__)

    def _options(self, parser: argparse.ArgumentParser) -> set[str]:
        return {option for action in parser._actions for option in action.option_strings}

    def command_problems(self, text: str) -> Iterator[str]:
        """`warmup COMMAND ... --option` in a line of code: the command and each option must exist."""
        for match in re.finditer(
            r"(?:^|[\s`(\"'$])warmup ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)([^\n`]*)", text
        ):
            words = match.group(1).split()
            name = f"warmup {words[0]}"
            if name not in self.commands:
                if words[0] in (
                    "is",
                    "the",
                    "a",
                    "and",
                    "or",
                    "of",
                    "to",
                    "in",
                    "on",
                    "for",
                    "as",
                    "with",
                    "import",
                ):
                    continue  # prose that says "warmup is ..."
                yield f"`{name}` is not a command of the real parser"
                continue
            rest = match.group(2)
            if len(words) > 1:
                if f"{name} {words[1]}" in self.commands:
                    name = f"{name} {words[1]}"
                else:
                    rest = words[1] + rest
            options = self._options(self.commands[name])
            try:
                tokens = shlex.split(rest, comments=True)
            except ValueError:
                tokens = rest.split()
            for token in tokens:
                if token in ("--", "|", "&&", ";", ">", "2>&1", "\\") or token.startswith((">", "|")):
                    break
                if token.startswith("--") and len(token) > 2:
                    option = token.split("=")[0].rstrip(")\"',;")
                    if option not in options:
                        yield f"`{name}` has no option `{option}`"

    def problems(self, markdown: str) -> Iterator[str]:
        code = [m.group(2) for m in FENCE.finditer(markdown)]
        prose = FENCE.sub("", markdown)
        code += INLINE.findall(prose)
        for block in code:
            for line in block.replace("\\\n", " ").splitlines():
                yield from self.command_problems(line)
        for name in sorted(set(ENV_NAME.findall(markdown)) - self.variables):
            yield f"{name} is not a variable the code reads"
        for path in sorted({p for block in code for p in REPO_PATH.findall(block)}):
            if path not in EXTERNAL_PATHS and not (REPO / path.rstrip("/")).exists():
                yield f"`{path}` is not a file or folder of the repository"
        for names in FROM_WARMUP.findall("\n".join(code)):
            for name in (n.strip(" ()") for n in names.split(",")):
                if name and name not in self.public:
                    yield f"`from warmup import {name}`: {name} is not in warmup.__all__"


_checker: _Checker | None = None


def _check(where: str, markdown: str) -> None:
    global _checker
    if _checker is None:
        _checker = _Checker()
    for problem in _checker.problems(markdown):
        log.warning("%s: %s", where, problem)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri not in PAGES:
        _check(f"docs/{page.file.src_uri}", markdown)
    return markdown


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def on_post_build(config: MkDocsConfig) -> None:
    for name in CHECKED_OUTSIDE:
        path = REPO / name
        if path.is_file():
            text = path.read_text()
            _check(name, text)
            for target in LINK.findall(text):  # relative links must land on a file (mkdocs checks the pages)
                if "://" not in target and not (path.parent / target).exists():
                    log.warning("%s: the link to %s leads nowhere", name, target)
