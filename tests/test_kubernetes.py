"""The class on Kubernetes (autograder/kubernetes.py, deploy/kubernetes/): the pods KubeSpawner makes from the
values, the manifests read by the Kubernetes API's models, the uids, and the collect that checks them. No
cluster: the chart's schema is checked by ``deploy/kubernetes/validate.py --chart`` (docs/deploying.md)."""

import asyncio
import datetime
import hashlib
import importlib.util
import itertools
import os
from pathlib import Path

import pytest
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from autograder.exchange import CollectWithoutFollowingLinks
from autograder.hub import Member
from autograder.kubernetes import class_values, instructors_gid, pod_uid

ROOT = Path(__file__).resolve().parents[1]
ROSTER = [Member("teach", "instructor"), Member("ann", "student"), Member("ben", "student")]


@pytest.fixture(scope="module")
def validate():
    spec = importlib.util.spec_from_file_location("validate", ROOT / "deploy" / "kubernetes" / "validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.offline_cluster()
    return module


@pytest.fixture(scope="module")
def pods(validate, tmp_path_factory):
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text("username,role\n" + "".join(f"{m.name},{m.role}\n" for m in ROSTER))
    merged = validate.values(roster, "alibi")
    config = validate.hub_config(merged)
    return {m.name: asyncio.run(validate.pod_manifest(config, merged, m.name)) for m in ROSTER}


def _mounts(pod) -> list[str]:
    return [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]


def test_each_members_pod_runs_as_their_own_uid_and_only_instructors_reach_the_course_root(pods):
    for m in ROSTER:
        pod, user = pods[m.name], pods[m.name]["spec"]["containers"][0]["securityContext"]
        assert (user["runAsUser"], user["runAsGroup"], pod["spec"]["securityContext"]["fsGroup"]) == (
            pod_uid(m.name),) * 3
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["JUPYTER_CONFIG_PATH"] == f"/etc/alibi/{m.role}"
        assert pod["metadata"]["labels"]["alibi/role"] == m.role  # what grading.yaml's network policies select
        assert "/srv/nbgrader/exchange" in _mounts(pod)
        instructor = m.role == "instructor"
        assert ("/srv/nbgrader/courses" in _mounts(pod)) == instructor
        assert pod["spec"]["securityContext"].get("supplementalGroups", []) == (
            [instructors_gid("alibi")] if instructor else [])
    assert len({pod_uid(m.name) for m in ROSTER}) == len(ROSTER)


def test_the_class_values_let_in_the_roster_alone_and_give_the_course_root_a_collect_that_checks_pods(tmp_path):
    values = class_values(ROSTER, "alibi")
    assert values["hub"]["config"]["Authenticator"] == {"allowed_users": ["ann", "ben", "teach"],
                                                        "allow_existing_users": False}
    files = values["singleuser"]["extraFiles"]
    course = next(f for f in files.values() if f["mountPath"] == "/srv/nbgrader/courses/alibi/nbgrader_config.py")
    (tmp_path / "nbgrader_config.py").write_text(course["stringData"])
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert config.CollectWithoutFollowingLinks.accounts == "pods"
    assert (config.Exchange.root, config.CourseDirectory.root) == ("/srv/nbgrader/exchange",
                                                                  "/srv/nbgrader/courses/alibi")
    students = next(f for f in files.values() if f["mountPath"] == "/etc/alibi/student/jupyter_server_config.json")
    assert '"nbgrader.server_extensions.formgrader": false' in students["stringData"]


def test_two_names_with_one_uid_are_refused_not_shared():
    seen = {}
    for n in itertools.count():  # a birthday search: about 40,000 names to find two with one uid
        name = f"s{hashlib.sha256(str(n).encode()).hexdigest()[:8]}"
        if pod_uid(name) in seen:
            break
        seen[pod_uid(name)] = name
    twins = [seen[pod_uid(name)], name]
    with pytest.raises(ValueError, match=f"{twins[1]} would run as uid {pod_uid(name)}, as {twins[0]} does"):
        class_values([Member("teach", "instructor"), *(Member(t, "student") for t in twins)], "alibi")


def test_every_manifest_field_is_known_to_the_kubernetes_api_and_a_misspelt_one_is_found(validate):
    objects = validate.kubernetes_objects("alibi")
    assert {o["kind"] for o in objects} >= {"Deployment", "StatefulSet", "NetworkPolicy", "Job",
                                            "PersistentVolumeClaim"}
    for document in objects:
        assert asyncio.run(validate.dropped_fields(document)) == [], document["metadata"]["name"]
    worker = next(o for o in objects if o["metadata"]["name"] == "alibi-dask-worker")
    worker["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilites"] = {"add": ["SYS_ADMIN"]}
    assert asyncio.run(validate.dropped_fields(worker)) == [
        "Deployment.spec.template.spec.containers[0].securityContext.capabilites"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making folders of other uids needs root")
def test_a_collect_on_kubernetes_leaves_out_a_folder_made_by_another_pods_uid(tmp_path):
    inbound = tmp_path / "inbound"
    stamp = datetime.datetime(2026, 1, 1)
    records = []
    for name, maker in (("ann", "ann"), ("ben", "ann")):  # ann's pod makes a folder in ben's name
        folder = inbound / f"{name}+ps1+2026-01-01 00:00:00.000000 UTC"
        folder.mkdir(parents=True)
        os.chown(folder, pod_uid(maker), pod_uid(maker))
        records.append({"username": name, "filename": folder.name, "timestamp": stamp})
    collect = CollectWithoutFollowingLinks(config=Config({"CollectWithoutFollowingLinks": {"accounts": "pods"}}))
    collect.inbound_path = str(inbound)
    assert collect._forged(records[0]) == ""
    assert collect._forged(records[1]) == f"made by uid {pod_uid('ann')}, not by ben"


@pytest.mark.skipif(os.geteuid() != 0, reason="making folders of other uids needs root")
def test_a_folder_forged_before_the_due_date_does_not_cost_the_student_their_late_submission(tmp_path):
    """With nbgrader's ``before_duedate``, the collect takes a student's last submission before the due date, or
    their last one where none is before it: a folder another pod made in ann's name, stamped before the due date,
    is neither taken nor taken in place of ann's own late one."""
    from nbgrader.api import Gradebook
    from nbgrader.coursedir import CourseDirectory

    from autograder.workspace import ensure_tools_on_path

    ensure_tools_on_path()  # nbgrader makes a gradebook with alembic, from the environment's bin folder
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(db, "alibi") as gb:
        gb.add_assignment("ps1", duedate=datetime.datetime(2026, 1, 10))
    inbound = tmp_path / "exchange" / "alibi" / "inbound"
    for maker, day in (("ann", 11), ("ben", 9)):  # ann's own, a day late; ben's pod's, in her name, a day early
        folder = inbound / f"ann+ps1+2026-01-{day} 00:00:00.000000 UTC"
        folder.mkdir(parents=True)
        os.chown(folder, pod_uid(maker), pod_uid(maker))
    config = Config({"CollectWithoutFollowingLinks": {"accounts": "pods", "before_duedate": True},
                     "CourseDirectory": {"course_id": "alibi", "assignment_id": "ps1", "db_url": db,
                                         "root": str(tmp_path / "course")},
                     "Exchange": {"root": str(tmp_path / "exchange")}})
    collect = CollectWithoutFollowingLinks(coursedir=CourseDirectory(config=config), config=config)
    collect.init_src()
    assert [r["filename"] for r in collect.src_records] == ["ann+ps1+2026-01-11 00:00:00.000000 UTC"]

