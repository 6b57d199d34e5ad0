"""The class on Kubernetes with Zero to JupyterHub (docs/deploying.md, "Kubernetes"): the chart values a roster
makes, given to helm beside ``deploy/kubernetes/values.yaml``::

    python -m autograder kubernetes --roster hub/roster.csv --course alibi > class-values.yaml
    helm upgrade --install alibi jupyterhub/jupyterhub -f deploy/kubernetes/values.yaml -f class-values.yaml

The chart runs every user's pod as one uid (1000); on an exchange shared by every pod, every student could then
read and replace every other's submission. Here each member's pod runs as a uid of their own, ``pod_uid``, drawn
from the name alone, so that no state is kept between rosters and a name keeps its uid (and its files) when the
roster changes; the collect checks each inbound folder's owner against the same function
(``CollectWithoutFollowingLinks.accounts = "pods"``). The values carry data only: the code that reads them is
``hub.extraConfig`` in ``deploy/kubernetes/values.yaml``.
"""

from __future__ import annotations

import hashlib
import re

from .hub import ROLES, Member, course_config, role_config

# above the accounts of any image (docker-stacks' jovyan is 1000) and of the host's usual ranges
POD_UID_FIRST = 1 << 20
POD_UID_SPAN = 1 << 30
EXCHANGE = "/srv/nbgrader/exchange"  # nbgrader's default, on a volume every pod mounts (ReadWriteMany)
COURSES = "/srv/nbgrader/courses"  # the course root, on a volume the instructors' pods alone mount
ROLE_CONFIG = "/etc/alibi"  # each role's Jupyter config folder, ROLE_CONFIG/<role>


def pod_uid(name: str) -> int:
    """The uid a member's pod runs as (and its gid): the same for a name wherever it is asked."""
    digest = hashlib.sha256(f"alibi-course-member:{name}".encode()).digest()
    return POD_UID_FIRST + int.from_bytes(digest[:8], "big") % POD_UID_SPAN


def instructors_gid(course_id: str) -> int:
    """The group that shares the course root between the course's instructors."""
    return pod_uid(f"{course_id}-instructors")


def class_values(members: list[Member], course_id: str) -> dict:
    """The chart values for the roster: who may log in, each member's role and uid, the course's paths, each
    role's Jupyter config as files in every pod (a student who points Jupyter at the instructors' folder gets
    formgrader over files they cannot reach: the course volume is not in their pod), and the course root's
    nbgrader_config.py."""
    ids: dict[int, str] = {instructors_gid(course_id): f"the group {course_id}-instructors"}
    for m in members:
        uid = pod_uid(m.name)
        if uid in ids:  # about one roster of 1,000 in 2,000: a new name, not a silent shared uid
            raise ValueError(f"{m.name} would run as uid {uid}, as {ids[uid]} does: give one of them another "
                             "username")
        ids[uid] = m.name
    course_root = f"{COURSES}/{course_id}"
    files = {f"alibi-{role}-{name.replace('/', '-').replace('.', '-').replace('_', '-')}":
             {"mountPath": f"{ROLE_CONFIG}/{role}/{name}", "stringData": text, "mode": 0o444}
             for role in ROLES for name, text in role_config(role, course_id, EXCHANGE, course_root).items()}
    # the course root's config, read-only in the instructors' pods: the collect there checks pods' uids
    files["alibi-course-config"] = {"mountPath": f"{course_root}/nbgrader_config.py", "mode": 0o444,
                                    "stringData": course_config(course_id, course_root, EXCHANGE, "pods")}
    return {
        "custom": {"course": {
            "id": course_id, "root": course_root, "courses": COURSES, "roleConfig": ROLE_CONFIG,
            "instructorsGid": instructors_gid(course_id),
            "members": {m.name: {"role": m.role, "uid": pod_uid(m.name)} for m in members},
        }},
        "hub": {"config": {"Authenticator": {"allowed_users": sorted(m.name for m in members),
                                             "allow_existing_users": False}}},
        "singleuser": {"extraFiles": files},
    }


def prepare_volumes_job(course_id: str, image: str) -> dict:
    """A one-off Kubernetes Job, run as root once before the class logs in: the exchange laid out as nbgrader's
    documentation lays it out for several users (1777), the course root made for the instructors' group alone
    (set-gid, so what one instructor writes the others can grade)."""
    root, gid = f"{COURSES}/{course_id}", instructors_gid(course_id)
    script = (f"chmod 1777 {EXCHANGE} && mkdir -p {root} && chown 0:{gid} {COURSES} {root} && "
              f"chmod 0750 {COURSES} && chmod 2770 {root}")
    name = re.sub("[^a-z0-9-]", "-", f"{course_id.lower()}-prepare-volumes")  # a DNS label, as Kubernetes names are
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "prepare", "image": image, "command": ["sh", "-c", script],
                            "securityContext": {"runAsUser": 0},
                            "volumeMounts": [{"name": "exchange", "mountPath": EXCHANGE},
                                             {"name": "courses", "mountPath": COURSES}]}],
            "volumes": [{"name": "exchange", "persistentVolumeClaim": {"claimName": "alibi-exchange"}},
                        {"name": "courses", "persistentVolumeClaim": {"claimName": "alibi-courses"}}],
        }}},
    }
