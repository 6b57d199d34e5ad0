"""JupyterHub for the class that ``python -m autograder hub`` set up (autograder/hub.py): the roster and the
course from ALIBI_HUB_STATE, on 127.0.0.1 only.

For the authenticators universities use, replace the passwords below (docs/deploying.md, "Serving a
class"): OAuth (``oauthenticator``) or LTI 1.3 (``jupyterhub-ltiauthenticator``), keeping ``allowed_users``
and the spawner as they are.
"""

import json
import os
from pathlib import Path

state = Path(os.environ["ALIBI_HUB_STATE"])
port = int(os.environ.get("ALIBI_HUB_PORT", "8000"))
roster = json.loads((state / "private" / "roster.json").read_text())
roles = {m["name"]: m["role"] for m in roster["members"]}
venv_bin = str(Path(roster["python"]).parent)

c = get_config()  # noqa: F821
c.JupyterHub.bind_url = f"http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = port + 1
c.ConfigurableHTTPProxy.command = [str(state / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{port + 2}"
private = state / "private"  # root's alone (autograder/hub.py)
c.ConfigurableHTTPProxy.pid_file = str(private / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{private / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(private / "jupyterhub_cookie_secret")

# the roster's users alone, with the passwords the set-up gave them (private/initial-passwords.csv), which
# FirstUseAuthenticator checks and lets them change (/hub/auth/change-password)
c.JupyterHub.authenticator_class = "firstuseauthenticator.FirstUseAuthenticator"
c.FirstUseAuthenticator.create_users = False
c.FirstUseAuthenticator.dbm_path = str(private / "passwords.dbm")
c.FirstUseAuthenticator.min_password_length = 8
c.Authenticator.allowed_users = set(roles)
c.Authenticator.allow_existing_users = False  # one dropped from the roster is no longer let in

# each server runs as its user's own system account (LocalProcessSpawner), in JupyterLab
c.Spawner.cmd = [f"{venv_bin}/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120


def by_role(spawner):
    """The user's role's Jupyter config: nbgrader's course and exchange; students' servers without formgrader."""
    spawner.environment["JUPYTER_CONFIG_PATH"] = str(state / "config" / roles[spawner.user.name])
    spawner.environment["PATH"] = f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"


c.Spawner.pre_spawn_hook = by_role
