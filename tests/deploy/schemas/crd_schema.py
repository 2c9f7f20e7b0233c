"""KubeRay CRD schemas for offline validation of k8s/ manifests.

The committed ``*.openapi.json`` files are the ``openAPIV3Schema`` of the served-and-stored
``v1`` version of KubeRay's RayCluster and RayJob CRDs, unmodified. ``to_json_schema`` turns such
an OpenAPI v3 (Kubernetes structural) schema into a JSON Schema that ``jsonschema`` can enforce
the way the API server and ``kubectl apply`` (field validation ``Strict``) do:

- ``x-kubernetes-int-or-string`` → integer or string;
- ``nullable: true`` → null allowed as well;
- an object that declares ``properties`` and neither ``additionalProperties`` nor
  ``x-kubernetes-preserve-unknown-fields`` rejects unknown fields (the API server would prune
  them; kubectl's strict field validation reports them);
- ``x-kubernetes-preserve-unknown-fields`` objects stay open;
- ``x-kubernetes-embedded-resource`` objects also accept apiVersion, kind and metadata;
- CEL rules (``x-kubernetes-validations``), list types and descriptions are dropped (not
  checkable here).

Refresh the copies from a KubeRay checkout's CRDs with
``python tests/deploy/schemas/crd_schema.py ../shared/k8s-crds``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# kind → (CRD file in ray-operator/config/crd/bases/, committed extract)
CRDS = {
    "RayCluster": ("ray.io_rayclusters.yaml", "raycluster-v1.openapi.json"),
    "RayJob": ("ray.io_rayjobs.yaml", "rayjob-v1.openapi.json"),
}
VERSION = "v1"

# Keywords JSON Schema shares with OpenAPI v3 and that validate values.
_PASSTHROUGH = (
    "enum",
    "minimum",
    "maximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "required",
)


def extract(crd: dict[str, Any], version: str = VERSION) -> dict[str, Any]:
    """The openAPIV3Schema of one version of a CustomResourceDefinition."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise KeyError(f"{crd['metadata']['name']} has no version {version}")


def load_openapi(kind: str) -> dict[str, Any]:
    return json.loads((HERE / CRDS[kind][1]).read_text())


def json_schema(kind: str) -> dict[str, Any]:
    """Draft-7 JSON Schema of a KubeRay kind (``RayCluster`` or ``RayJob``), from the copy."""
    schema = to_json_schema(load_openapi(kind))
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return schema


def to_json_schema(node: dict[str, Any], *, closed: bool = True) -> dict[str, Any]:
    """Convert one OpenAPI v3 structural schema node. ``closed`` is False inside
    anyOf/allOf/oneOf/not, whose branches only add value checks to the node around them."""
    out: dict[str, Any] = {}
    for key in _PASSTHROUGH:
        if key in node:
            out[key] = node[key]
    if node.get("exclusiveMinimum") is True:  # OpenAPI 3.0 booleans → draft-7 numbers
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")

    types: list[str] = []
    if node.get("x-kubernetes-int-or-string"):
        types = ["integer", "string"]
    elif "type" in node:
        types = [node["type"]]
    if types and node.get("nullable"):
        types.append("null")
    if types:
        out["type"] = types[0] if len(types) == 1 else types

    for key in ("anyOf", "allOf", "oneOf"):
        if key in node and not node.get("x-kubernetes-int-or-string"):
            out[key] = [to_json_schema(branch, closed=False) for branch in node[key]]
    if "not" in node:
        out["not"] = to_json_schema(node["not"], closed=False)
    if "items" in node:
        out["items"] = to_json_schema(node["items"])

    properties = dict(node.get("properties", {}))
    if node.get("x-kubernetes-embedded-resource"):
        for name in ("apiVersion", "kind"):
            properties.setdefault(name, {"type": "string"})
        properties.setdefault("metadata", {"type": "object"})
    if properties:
        out["properties"] = {name: to_json_schema(sub) for name, sub in properties.items()}

    additional = node.get("additionalProperties")
    if isinstance(additional, dict):
        out["additionalProperties"] = to_json_schema(additional)
    elif isinstance(additional, bool):
        out["additionalProperties"] = additional
    elif properties and closed and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def refresh(crd_dir: Path) -> None:
    """Rewrite the committed extracts from the CRD files in ``crd_dir``."""
    import yaml

    for crd_file, extract_file in CRDS.values():
        crd = yaml.load((crd_dir / crd_file).read_text(), Loader=_loader())
        text = json.dumps(extract(crd), indent=1, ensure_ascii=False) + "\n"
        (HERE / extract_file).write_text(text)
        print(f"wrote {HERE / extract_file}")


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/deploy/schemas/crd_schema.py CRD_DIR")
    refresh(Path(sys.argv[1]))
