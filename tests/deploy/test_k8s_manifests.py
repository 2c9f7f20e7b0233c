"""The Kubernetes manifests in k8s/, checked offline.

- RayCluster/RayJob against KubeRay v1.7's own CRD schemas (tests/deploy/schemas/), with unknown
  fields rejected as `kubectl apply` does;
- core kinds against the Kubernetes API schemas that kubernetes-validate ships (strict);
- yamllint over k8s/ and recipes/;
- every RayJob entrypoint is a `trainforge train` of a shipped recipe whose overrides validate;
- the conventions the deployment depends on: resources and a non-root security context on every
  container, GPU worker groups with the GPU limit, the GPU toleration and a memory-backed
  /dev/shm, the shared volume and MLflow settings on every Ray pod, references that resolve.

Each check is also shown to fail on a deliberately broken copy of a real manifest.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from omegaconf import OmegaConf
from packaging.specifiers import SpecifierSet
from yamllint import linter
from yamllint.config import YamlLintConfig

from tests.deploy.schemas import crd_schema

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
SHARED_CRDS = ROOT.parent / "shared" / "k8s-crds"
NAMESPACE = "trainforge"
K8S_VERSION = "1.32"  # a Kubernetes version whose schemas kubernetes-validate ships
RAY_KINDS = ("RayCluster", "RayJob")
SHARED_MOUNT = "/mnt/shared"
GPU = "nvidia.com/gpu"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMAGE = f"ghcr.io/trainforge/trainforge:{PYPROJECT['project']['version']}"


def _load_manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name.startswith("."):
            continue  # .yamllint.yaml
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append(
                    (f"{path.relative_to(ROOT)}:{doc['kind']}/{doc['metadata']['name']}", doc)
                )
    return docs


MANIFESTS = _load_manifests()
RAY_DOCS = [(name, doc) for name, doc in MANIFESTS if doc["kind"] in RAY_KINDS]
CORE_DOCS = [(name, doc) for name, doc in MANIFESTS if doc["kind"] not in RAY_KINDS]
RAYJOBS = [(name, doc) for name, doc in RAY_DOCS if doc["kind"] == "RayJob"]


def _ids(items: list[tuple[str, Any]]) -> list[str]:
    return [name for name, _ in items]


@pytest.fixture(scope="module")
def validators() -> dict[str, jsonschema.Draft7Validator]:
    return {kind: jsonschema.Draft7Validator(crd_schema.json_schema(kind)) for kind in RAY_KINDS}


def _ray_errors(validators: dict[str, jsonschema.Draft7Validator], doc: dict) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validators[doc["kind"]].iter_errors(doc)
    ]


def _core_errors(doc: dict) -> list[str]:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path))}: {e.message}"]
    return []


# --------------------------------------------------------------------------- the inventory


def test_the_expected_manifests_exist() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in MANIFESTS}
    for expected in [
        ("Namespace", NAMESPACE),
        ("RayCluster", "trainforge"),
        ("RayJob", "cifar10-resnet18"),
        ("PersistentVolumeClaim", "trainforge-shared"),
        ("ConfigMap", "trainforge-mlflow"),
        ("Deployment", "mlflow"),
        ("Service", "mlflow"),
        ("StatefulSet", "postgres"),
        ("Service", "postgres"),
    ]:
        assert expected in kinds
    for _, doc in MANIFESTS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]


# --------------------------------------------------------------------------- KubeRay CRD schemas


@pytest.mark.parametrize(("name", "doc"), RAY_DOCS, ids=_ids(RAY_DOCS))
def test_ray_manifest_matches_the_kuberay_crd(validators, name: str, doc: dict) -> None:
    assert doc["apiVersion"] == f"ray.io/{crd_schema.VERSION}"
    assert _ray_errors(validators, doc) == []


def _rayjob(name: str) -> dict:
    return copy.deepcopy(next(doc for n, doc in RAYJOBS if doc["metadata"]["name"] == name))


def _raycluster() -> dict:
    return copy.deepcopy(next(doc for _, doc in RAY_DOCS if doc["kind"] == "RayCluster"))


def _broken_ray_docs() -> Iterator[tuple[str, dict, str]]:
    job = _rayjob("cifar10-resnet18")
    job["spec"]["shutdownAfterJobFinishes"] = "yes"
    yield "rayjob-string-for-boolean", job, "is not of type 'boolean'"

    job = _rayjob("cifar10-resnet18")
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["serviceAccount"] = "default"
    yield "rayjob-unknown-field-in-head-group", job, "'serviceAccount' was unexpected"

    job = _rayjob("cifar10-resnet18")
    del job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    yield "rayjob-head-group-without-template", job, "'template' is a required property"

    job = _rayjob("cifar10-resnet18")
    job["spec"]["authOptions"] = {"mode": "token"}  # belongs under rayClusterSpec
    yield "rayjob-field-at-the-wrong-level", job, "'authOptions' was unexpected"

    cluster = _raycluster()
    worker = cluster["spec"]["workerGroupSpecs"][0]
    worker["template"]["spec"]["containers"][0]["resources"]["limits"][GPU] = [4]
    yield "raycluster-quantity-not-int-or-string", cluster, "is not of type 'integer', 'string'"

    cluster = _raycluster()
    del cluster["spec"]["workerGroupSpecs"][0]["groupName"]
    yield "raycluster-worker-group-without-name", cluster, "'groupName' is a required property"

    cluster = _raycluster()
    cluster["spec"]["authOptions"]["mode"] = "password"
    yield "raycluster-enum", cluster, "is not one of"


BROKEN_RAY = list(_broken_ray_docs())


@pytest.mark.parametrize(
    ("case", "doc", "message"), BROKEN_RAY, ids=[case for case, _, _ in BROKEN_RAY]
)
def test_broken_ray_manifest_is_rejected(validators, case: str, doc: dict, message: str) -> None:
    errors = _ray_errors(validators, doc)
    assert any(message in error for error in errors), errors


def test_int_or_string_quantities_accept_both(validators) -> None:
    cluster = _raycluster()
    limits = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    limits["resources"]["limits"][GPU] = 4
    assert _ray_errors(validators, cluster) == []


def test_schema_conversion_rules() -> None:
    convert = crd_schema.to_json_schema
    closed = convert({"type": "object", "properties": {"a": {"type": "string"}}})
    assert closed["additionalProperties"] is False
    open_ = convert(
        {"type": "object", "properties": {"a": {}}, "x-kubernetes-preserve-unknown-fields": True}
    )
    assert "additionalProperties" not in open_
    mapping = convert({"type": "object", "additionalProperties": {"type": "string"}})
    assert mapping["additionalProperties"] == {"type": "string"}
    quantity = convert(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": "^[0-9]+$",
            "x-kubernetes-int-or-string": True,
        }
    )
    assert quantity == {"pattern": "^[0-9]+$", "type": ["integer", "string"]}
    assert convert({"type": "string", "nullable": True})["type"] == ["string", "null"]
    # anyOf branches only add checks to the object around them: they must not close it.
    either = convert(
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "anyOf": [{"required": ["a"], "properties": {"a": {}}}, {"required": ["b"]}],
        }
    )
    assert "additionalProperties" not in either["anyOf"][0]
    validator = jsonschema.Draft7Validator(either)
    assert validator.is_valid({"b": "x"}) and not validator.is_valid({"c": "x"})


@pytest.mark.skipif(not SHARED_CRDS.is_dir(), reason="../shared/k8s-crds is not beside the repo")
def test_committed_schemas_are_the_crds_unmodified() -> None:
    for kind, (crd_file, _) in crd_schema.CRDS.items():
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        crd = yaml.load((SHARED_CRDS / crd_file).read_text(), Loader=loader)
        assert crd_schema.extract(crd) == crd_schema.load_openapi(kind), kind


# --------------------------------------------------------------------------- core kinds


@pytest.mark.parametrize(("name", "doc"), CORE_DOCS, ids=_ids(CORE_DOCS))
def test_core_manifest_matches_the_kubernetes_api(name: str, doc: dict) -> None:
    assert _core_errors(doc) == []


def _core_doc(kind: str, name: str) -> dict:
    return copy.deepcopy(
        next(doc for _, doc in CORE_DOCS if doc["kind"] == kind and doc["metadata"]["name"] == name)
    )


def _broken_core_docs() -> Iterator[tuple[str, dict, str]]:
    deployment = _core_doc("Deployment", "mlflow")
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    yield "deployment-unknown-field", deployment, "'resource' was unexpected"

    service = _core_doc("Service", "mlflow")
    service["spec"]["ports"][0]["port"] = "http"
    yield "service-port-not-a-number", service, "is not of type 'integer'"

    pvc = _core_doc("PersistentVolumeClaim", "trainforge-shared")
    pvc["spec"]["accessModes"] = "ReadWriteMany"
    yield "pvc-access-modes-not-a-list", pvc, "is not of type 'array'"

    statefulset = _core_doc("StatefulSet", "postgres")
    del statefulset["spec"]["selector"]
    yield "statefulset-without-selector", statefulset, "'selector' is a required property"


BROKEN_CORE = list(_broken_core_docs())


@pytest.mark.parametrize(
    ("case", "doc", "message"), BROKEN_CORE, ids=[case for case, _, _ in BROKEN_CORE]
)
def test_broken_core_manifest_is_rejected(case: str, doc: dict, message: str) -> None:
    errors = _core_errors(doc)
    assert any(message in error for error in errors), errors


# --------------------------------------------------------------------------- yamllint

YAMLLINT_CONFIG = K8S / ".yamllint.yaml"


def _lint(text: str, path: str) -> list[str]:
    config = YamlLintConfig(file=str(YAMLLINT_CONFIG))
    return [f"{path}:{p.line}:{p.column} {p.desc} ({p.rule})" for p in linter.run(text, config)]


def test_yamllint_passes_on_manifests_and_recipes() -> None:
    files = sorted([*K8S.rglob("*.yaml"), *(ROOT / "recipes").rglob("*.yaml")])
    assert len(files) >= 10
    problems = [p for f in files for p in _lint(f.read_text(), str(f.relative_to(ROOT)))]
    assert problems == []


def test_yamllint_catches_a_broken_manifest() -> None:
    text = (K8S / "storage.yaml").read_text()
    broken = text.replace("  name: trainforge-shared\n", "  name: trainforge-shared\n  name: x\n")
    broken += "# " + "words " * 25 + "\n"
    problems = _lint(broken, "broken.yaml")
    assert any("(key-duplicates)" in p for p in problems), problems
    assert any("(line-length)" in p for p in problems), problems


# --------------------------------------------------------------------------- RayJob entrypoints


def _entrypoint(doc: dict) -> tuple[Path, list[str]]:
    """`trainforge train RECIPE key=value ...` → (recipe, overrides)."""
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv[:2] == ["trainforge", "train"], argv
    recipe = ROOT / argv[2]  # relative to /app in the image, where the repo root is copied
    overrides = [arg for arg in argv[3:] if "=" in arg]
    assert len(overrides) == len(argv) - 3, f"unexpected arguments in {argv}"
    return recipe, overrides


@pytest.mark.parametrize(("name", "doc"), RAYJOBS, ids=_ids(RAYJOBS))
def test_rayjob_entrypoint_is_a_valid_recipe(name: str, doc: dict) -> None:
    from trainforge import config

    recipe, overrides = _entrypoint(doc)
    assert recipe.is_file(), recipe
    assert recipe.is_relative_to(ROOT / "recipes")
    cfg = config.load(recipe, overrides)
    # The run identity and its storage are set explicitly, on the shared volume.
    assert any(o.startswith("run.name=") for o in overrides)
    assert cfg.run.storage_path.startswith(f"{SHARED_MOUNT}/")
    assert doc["spec"]["jobId"] == cfg.run.name
    # data (CNN data sets) and simulation caches (SBI) live on the shared volume too
    for key in ("workload.data_root", "workload.simulation.cache_dir"):
        value = OmegaConf.select(OmegaConf.create(config.to_container(cfg)), key, default=None)
        if value is not None:
            assert value.startswith(f"{SHARED_MOUNT}/"), key


def test_a_broken_entrypoint_override_is_rejected() -> None:
    from trainforge import config
    from trainforge.errors import RecipeError

    recipe, overrides = _entrypoint(_rayjob("cifar10-resnet18"))
    for bad in ["run.nmae=x", "train.lr=-1", "scaling.use_gpu=maybe"]:
        with pytest.raises(RecipeError):
            config.load(recipe, [*overrides, bad])


@pytest.mark.parametrize(("name", "doc"), RAYJOBS, ids=_ids(RAYJOBS))
def test_rayjob_lifecycle(name: str, doc: dict) -> None:
    spec = doc["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["backoffLimit"] >= 1  # retries resume: same run.name on the same storage
    assert spec.get("entrypointNumGpus", 0) == 0  # the driver needs no GPU
    assert "submitterPodTemplate" in spec


# --------------------------------------------------------------------------- pod conventions


def _pod_specs(doc: dict) -> Iterator[tuple[str, dict]]:
    """(where, pod spec) of every pod a manifest makes."""
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        yield "template", spec["template"]["spec"]
    cluster = spec.get("rayClusterSpec") if doc["kind"] == "RayJob" else spec
    if doc["kind"] == "RayJob" and "submitterPodTemplate" in spec:
        yield "submitter", spec["submitterPodTemplate"]["spec"]
    if doc["kind"] in RAY_KINDS:
        yield "head", cluster["headGroupSpec"]["template"]["spec"]
        for group in cluster.get("workerGroupSpecs", []):
            yield f"worker/{group['groupName']}", group["template"]["spec"]


def _container_problems(pod: dict) -> list[str]:
    problems = []
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name = container["name"]
        resources = container.get("resources", {})
        for part in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(part, {}):
                    problems.append(f"{name}: no resources.{part}.{resource}")
        security = container.get("securityContext", {})
        if security.get("runAsNonRoot") is not True:
            problems.append(f"{name}: securityContext.runAsNonRoot is not true")
        if security.get("runAsUser", 1000) == 0:
            problems.append(f"{name}: runs as root")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if "ALL" not in security.get("capabilities", {}).get("drop", []):
            problems.append(f"{name}: capabilities are not all dropped")
    if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
        problems.append("pod: securityContext.runAsNonRoot is not true")
    return problems


ALL_PODS = [(f"{name}:{where}", pod) for name, doc in MANIFESTS for where, pod in _pod_specs(doc)]


@pytest.mark.parametrize(("name", "pod"), ALL_PODS, ids=_ids(ALL_PODS))
def test_every_container_has_resources_and_runs_unprivileged(name: str, pod: dict) -> None:
    assert _container_problems(pod) == []


def test_container_check_catches_missing_resources_and_root() -> None:
    pod = copy.deepcopy(_raycluster()["spec"]["headGroupSpec"]["template"]["spec"])
    del pod["containers"][0]["resources"]["limits"]
    pod["containers"][0]["securityContext"]["runAsNonRoot"] = False
    problems = _container_problems(pod)
    assert "ray-head: no resources.limits.cpu" in problems
    assert "ray-head: securityContext.runAsNonRoot is not true" in problems


def _volume_for(pod: dict, container: dict, mount_path: str) -> dict | None:
    mount = next(
        (m for m in container.get("volumeMounts", []) if m["mountPath"] == mount_path), None
    )
    if mount is None:
        return None
    return next((v for v in pod.get("volumes", []) if v["name"] == mount["name"]), None)


def _env_source(container: dict, name: str) -> dict | None:
    entry = next((e for e in container.get("env", []) if e["name"] == name), None)
    return None if entry is None else entry.get("valueFrom", {"value": entry.get("value")})


def _ray_pod_problems(pod: dict, gpu_group: bool) -> list[str]:
    problems = []
    container = pod["containers"][0]
    if container["image"] != IMAGE:
        problems.append(f"image {container['image']} is not {IMAGE}")
    shm = _volume_for(pod, container, "/dev/shm")
    if shm is None or shm.get("emptyDir", {}).get("medium") != "Memory":
        problems.append("no memory-backed emptyDir at /dev/shm")
    elif "sizeLimit" not in shm["emptyDir"]:
        problems.append("/dev/shm has no sizeLimit")
    shared = _volume_for(pod, container, SHARED_MOUNT)
    if (shared or {}).get("persistentVolumeClaim", {}).get("claimName") != "trainforge-shared":
        problems.append(f"the shared PVC is not mounted at {SHARED_MOUNT}")
    uri = _env_source(container, "MLFLOW_TRACKING_URI") or {}
    if uri.get("configMapKeyRef", {}).get("name") != "trainforge-mlflow":
        problems.append("MLFLOW_TRACKING_URI does not come from the ConfigMap")
    for variable in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        if "secretKeyRef" not in (_env_source(container, variable) or {}):
            problems.append(f"{variable} does not come from a Secret")
    if (_env_source(container, "GLOO_SOCKET_IFNAME") or {}).get("value") != "eth0":
        problems.append("GLOO_SOCKET_IFNAME is not eth0")
    if gpu_group:
        if not container["resources"].get("limits", {}).get(GPU):
            problems.append(f"no {GPU} limit")
        if (_env_source(container, "NCCL_SOCKET_IFNAME") or {}).get("value") != "eth0":
            problems.append("NCCL_SOCKET_IFNAME is not eth0")
        toleration = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
        if toleration not in pod.get("tolerations", []):
            problems.append(f"no toleration for {GPU}")
    elif GPU in container["resources"].get("limits", {}):
        problems.append(f"{GPU} on a pod that is not a GPU worker")
    return problems


def _ray_pods(doc: dict) -> Iterator[tuple[str, dict, bool]]:
    for where, pod in _pod_specs(doc):
        if where == "submitter":
            continue
        gpu = where.startswith("worker/") and (
            "gpu" in where or GPU in str(pod["containers"][0]["resources"])
        )
        yield where, pod, gpu


RAY_PODS = [
    (f"{name}:{where}", pod, gpu) for name, doc in RAY_DOCS for where, pod, gpu in _ray_pods(doc)
]


@pytest.mark.parametrize(("name", "pod", "gpu"), RAY_PODS, ids=[n for n, _, _ in RAY_PODS])
def test_ray_pod_conventions(name: str, pod: dict, gpu: bool) -> None:
    assert _ray_pod_problems(pod, gpu) == []


def test_gpu_manifests_have_gpu_worker_groups() -> None:
    for doc in (_raycluster(), _rayjob("cifar10-resnet18")):
        assert any(gpu for _, _, gpu in _ray_pods(doc)), doc["metadata"]["name"]


def test_gpu_check_catches_a_missing_shm_toleration_and_limit() -> None:
    worker = _raycluster()["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    worker["volumes"] = [v for v in worker["volumes"] if v["name"] != "dshm"]
    del worker["tolerations"]
    for part in ("requests", "limits"):
        del worker["containers"][0]["resources"][part][GPU]
    problems = _ray_pod_problems(worker, gpu_group=True)
    assert "no memory-backed emptyDir at /dev/shm" in problems
    assert f"no toleration for {GPU}" in problems
    assert f"no {GPU} limit" in problems


def test_ray_version_and_authentication() -> None:
    ray_requirement = next(
        r for r in PYPROJECT["project"]["dependencies"] if r.replace(" ", "").startswith("ray[")
    )
    specifier = SpecifierSet(ray_requirement.split("]", 1)[1])
    for _, doc in RAY_DOCS:
        cluster = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
        assert specifier.contains(cluster["rayVersion"]), cluster["rayVersion"]
        assert cluster["authOptions"]["mode"] == "token"
        head = cluster["headGroupSpec"]
        assert head["rayStartParams"].get("num-gpus") in (None, "0")
        assert GPU not in str(head["template"]["spec"]["containers"][0]["resources"])


# --------------------------------------------------------------------------- references


def _defined() -> dict[tuple[str, str], set[str]]:
    """(kind, name) → keys, for the ConfigMaps, Secrets and PVCs the manifests define."""
    found: dict[tuple[str, str], set[str]] = {}
    for _, doc in MANIFESTS:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("ConfigMap", "Secret"):
            found[(kind, name)] = set(doc.get("data", {})) | set(doc.get("stringData", {}))
        elif kind == "PersistentVolumeClaim":
            found[(kind, name)] = set()
    return found


def _references(pod: dict) -> Iterator[tuple[str, str, str | None]]:
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        for entry in container.get("env", []):
            source = entry.get("valueFrom", {})
            if "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                yield "ConfigMap", ref["name"], ref["key"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                yield "Secret", ref["name"], ref["key"]
        for entry in container.get("envFrom", []):
            if "configMapRef" in entry:
                yield "ConfigMap", entry["configMapRef"]["name"], None
            if "secretRef" in entry:
                yield "Secret", entry["secretRef"]["name"], None
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            yield "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"], None
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"], None
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"], None


def test_configmaps_secrets_and_claims_referenced_are_defined() -> None:
    defined = _defined()
    for name, pod in ALL_PODS:
        for kind, ref, key in _references(pod):
            assert (kind, ref) in defined, f"{name}: {kind} {ref} is not defined in k8s/"
            assert key is None or key in defined[(kind, ref)], f"{name}: {kind} {ref} has no {key}"


def test_example_secrets_hold_only_placeholders() -> None:
    for _, doc in MANIFESTS:
        if doc["kind"] == "Secret":
            assert "data" not in doc
            for key, value in doc["stringData"].items():
                if "PASSWORD" in key or "SECRET" in key:
                    assert value == "CHANGE-ME", f"{doc['metadata']['name']}.{key}"


def test_tracking_uri_names_the_mlflow_service() -> None:
    uri = urlparse(_core_doc("ConfigMap", "trainforge-mlflow")["data"]["MLFLOW_TRACKING_URI"])
    service, namespace, svc = uri.hostname.split(".")
    assert (namespace, svc) == (NAMESPACE, "svc")
    ports = [p["port"] for p in _core_doc("Service", service)["spec"]["ports"]]
    assert uri.port in ports
    # The server accepts that Host header, proxies artifacts and authenticates.
    script = _core_doc("Deployment", service)["spec"]["template"]["spec"]["containers"][0]["args"]
    script = "\n".join(script)
    assert f"{uri.hostname}:{uri.port}" in script
    for flag in (
        "--serve-artifacts",
        "--artifacts-destination /mlartifacts",
        "--app-name basic-auth",
        '--backend-store-uri "${db}/mlflow"',
    ):
        assert flag in script
    database = r'db="postgresql(\+psycopg2?)?://mlflow:\$\{POSTGRES_PASSWORD\}@postgres\.'
    assert re.search(database, script)


def test_submit_leaves_the_tracking_server_to_the_pods_and_takes_its_service_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pods take MLFLOW_TRACKING_URI from the ConfigMap; `trainforge submit`'s default
    runtime env sets none (it would override theirs, and a service name reaches nothing outside
    Kubernetes). Named for a job (tracking.tracking_uri), the service is taken as it is: it
    resolves only inside the cluster, so the submitting machine does not ask it."""
    from trainforge.driver import submit, submit_checks
    from trainforge.resources import default_runtime_env

    env = submit.build_runtime_env(default_runtime_env(), None, None)["env_vars"]
    assert "MLFLOW_TRACKING_URI" not in env
    uri = _core_doc("ConfigMap", "trainforge-mlflow")["data"]["MLFLOW_TRACKING_URI"]

    def asked(*args: object) -> str:
        raise AssertionError(f"{uri} was asked from outside the cluster")

    monkeypatch.setattr(submit_checks, "health_problem", asked)
    assert submit_checks.tracking_problem((uri, "tracking.tracking_uri"), "the job") is None
