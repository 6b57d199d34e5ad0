"""What of the Kubernetes deployment can be checked without a cluster, checked.

    python deploy/kubernetes/validate.py [--roster hub/roster.csv] [--chart PATH/zero-to-jupyterhub-k8s/jupyterhub]

1. The values helm would get (the chart's defaults, values.yaml, the roster's values) merged as helm merges them.
2. With ``--chart`` (a checkout of the chart at the version values.yaml names; and pycurl, the HTTP client the
   chart's hub image has): validated against the chart's values.schema.yaml, as ``helm install`` validates them,
   and the hub's whole configuration made by the chart's own jupyterhub_config.py.
3. The hub's configuration loaded (without --chart, hub.extraConfig alone, run on a traitlets config as the chart
   runs it), and KubeSpawner's pod for one student and one instructor made from it (KubeSpawner's own
   ``get_pod_manifest``): each runs as their own uid, the course volume is in the instructors' pods alone.
4. grading.yaml's objects and the Job that prepares the volumes read by the Kubernetes API's models
   (kubernetes_asyncio): a field the API does not have would be dropped on the way, and is reported.

What it cannot check: a real cluster's scheduling, volumes and network policies, and the image (see
docs/deploying.md, "Kubernetes").
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from autograder.hub import read_roster  # noqa: E402
from autograder.kubernetes import class_values, prepare_volumes_job  # noqa: E402


def helm_merge(base: dict, override: dict) -> dict:
    """Helm's merge of values files: maps merge key by key, anything else (lists too) is replaced, null deletes."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def values(roster: Path, course_id: str, chart_defaults: dict | None = None) -> dict:
    ours = yaml.safe_load((HERE / "values.yaml").read_text())
    # through YAML, as helm reads the file `autograder kubernetes` writes
    roster_values = yaml.safe_load(yaml.safe_dump(class_values(read_roster(roster), course_id)))
    return helm_merge(helm_merge(chart_defaults or {}, ours), roster_values)


def lookup(tree: dict, key: str, default=None):
    """z2jh.get_config's lookup, for when no chart is at hand: a dotted key into the values."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree


def hub_config(merged: dict, get_config=None):
    """The traitlets config hub.extraConfig makes, run as the chart runs it (``c`` and ``get_config`` in scope)."""
    from traitlets.config import Config

    c = Config()
    scope = {"c": c, "get_config": get_config or (lambda key, default=None: lookup(merged, key, default))}
    for name, source in sorted(merged["hub"]["extraConfig"].items()):
        exec(compile(source, f"hub.extraConfig.{name}", "exec"), scope)
    return c


# KubeSpawner reads a cluster's address when it is made; making a pod's manifest never contacts it
OFFLINE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: offline, user: {token: none}}]
contexts: [{name: offline, context: {cluster: offline, user: offline}}]
current-context: offline
"""


def offline_cluster() -> None:
    """Point kubernetes_asyncio at OFFLINE_KUBECONFIG, unless KUBECONFIG names a cluster already."""
    from kubernetes_asyncio.config import kube_config

    if "KUBECONFIG" not in os.environ:
        path = Path(tempfile.mkdtemp(prefix="alibi-kubeconfig-")) / "offline"
        path.write_text(OFFLINE_KUBECONFIG)
        # the module reads the variable once, when it is first imported
        os.environ["KUBECONFIG"] = kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)


async def pod_manifest(config, merged: dict, name: str) -> dict:
    """KubeSpawner's pod for the user, after the hub's pre-spawn hook; with values.yaml's volumes for every user's
    pod where the config does not have the chart's own (a cluster must be named: ``offline_cluster``)."""
    from jupyterhub.utils import maybe_future
    from kubernetes_asyncio.client import ApiClient
    from kubespawner import KubeSpawner
    from kubespawner.spawner import MockObject

    user = MockObject()
    user.name, user.id, user.url, user.escaped_name = name, 1, f"/user/{name}/", name
    storage = merged["singleuser"]["storage"]
    volumes = {} if "volumes" in config.KubeSpawner else {
        "volumes": list(storage["extraVolumes"]), "volume_mounts": list(storage["extraVolumeMounts"])}
    spawner = KubeSpawner(_mock=True, config=config, user=user, **volumes)
    await maybe_future(spawner.run_pre_spawn_hook())  # as JupyterHub's spawn runs it
    manifest = await spawner.get_pod_manifest()
    await spawner.api.api_client.close()
    async with ApiClient() as api:
        return api.sanitize_for_serialization(manifest)


async def dropped_fields(document: dict) -> list[str]:
    """The fields of a Kubernetes object that its API model does not have (they would be lost, or refused)."""
    from kubernetes_asyncio.client import ApiClient

    class Response:
        data = json.dumps(document)

    async with ApiClient() as api:
        kept = api.sanitize_for_serialization(api.deserialize(Response, f"V1{document['kind']}"))
    return _missing(document, kept, document["kind"])


def _missing(given, kept, where: str) -> list[str]:
    if isinstance(given, dict):
        kept = kept if isinstance(kept, dict) else {}
        return [f for key, value in given.items()
                for f in ([f"{where}.{key}"] if key not in kept else _missing(value, kept[key], f"{where}.{key}"))]
    if isinstance(given, list) and isinstance(kept, list):
        return [f for i, (a, b) in enumerate(zip(given, kept, strict=False)) for f in _missing(a, b, f"{where}[{i}]")]
    return []


def kubernetes_objects(course_id: str) -> list[dict]:
    """grading.yaml's objects and the Job that prepares the volumes."""
    return [*(d for d in yaml.safe_load_all((HERE / "grading.yaml").read_text()) if d),
            prepare_volumes_job(course_id, "registry.example.edu/alibi-course:1")]


def chart_hub_config(chart: Path, merged: dict):
    """The hub's whole configuration as the chart's own jupyterhub_config.py makes it from the values (hub.extraConfig
    last), its z2jh helpers reading these values instead of the hub pod's mounted secret and config map: resources
    named as the chart names them for a release called alibi, placeholder secrets, every service on port 8000."""
    from traitlets.config import Config

    hub_files = chart / "files" / "hub"
    spec = importlib.util.spec_from_file_location("z2jh", hub_files / "z2jh.py")
    z2jh = sys.modules["z2jh"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(z2jh)
    z2jh._load_config = lambda: merged
    z2jh._get_config_value = lambda key: f"alibi-{key}"
    z2jh.get_name_env = lambda name, suffix="": "8000"
    z2jh.get_secret_value = lambda key, default="unset": "00" * 32 if default == "unset" else default
    c = Config()
    source = (hub_files / "jupyterhub_config.py").read_text()
    exec(compile(source, str(hub_files / "jupyterhub_config.py"), "exec"),
         {"get_config": lambda: c, "__file__": str(hub_files / "jupyterhub_config.py")})
    return c


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roster", type=Path, default=HERE.parents[1] / "hub" / "roster.csv")
    parser.add_argument("--course", default="alibi")
    parser.add_argument("--chart", type=Path, help="the chart's folder (jupyterhub/ in zero-to-jupyterhub-k8s)")
    options = parser.parse_args()
    offline_cluster()
    defaults = yaml.safe_load((options.chart / "values.yaml").read_text()) if options.chart else None
    merged = values(options.roster, options.course, defaults)
    if options.chart:
        import jsonschema

        schema = yaml.safe_load((options.chart / "values.schema.yaml").read_text())
        jsonschema.validate(merged, schema)
        print(f"values: valid against {options.chart / 'values.schema.yaml'}")
        config = chart_hub_config(options.chart, merged)
    else:
        print("values: not checked against the chart's schema (no --chart)")
        config = hub_config(merged)
    members = merged["custom"]["course"]["members"]
    for role in ("student", "instructor"):
        name = next(n for n, m in members.items() if m["role"] == role)
        pod = asyncio.run(pod_manifest(config, merged, name))
        mounts = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
        context = pod["spec"]["containers"][0]["securityContext"]
        print(f"{role} {name}: uid {context['runAsUser']}, groups {pod['spec']['securityContext']}, "
              f"mounts {', '.join(mounts)}")
    for document in kubernetes_objects(options.course):
        dropped = asyncio.run(dropped_fields(document))
        print(f"{document['kind']} {document['metadata']['name']}: "
              + ("every field known to the API" if not dropped else "unknown fields " + ", ".join(dropped)))
        if dropped:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
