"""JupyterHub configuration of the course hub.

Every user's notebook server is a Slurm job on the GPU partition (batchspawner's SlurmSpawner,
the batch script ``hub/slurm-server.sh``), with one GPU and a time limit, started in the course's
Python environment as that user. nbgrader's exchange (release, fetch, submit, collect, feedback)
is one folder every user reaches; instructors get the formgrader in their own server, opened in
their course folder (``hub/course_folder.py`` makes it), where ``nbgrader autograde`` runs the
course's jailed grader (the repository's ``nbgrader_config.py``). Students get the assignment
list and no formgrader.

What changes from one cluster to another (partition, GPU request, time limit, paths, who logs
in) is in ``hub/site.toml``, or the file ``$COURSE_HUB_SITE`` names. Start the hub as root on the
login node (it submits each server's job as its user)::

    COURSE_HUB_SITE=/srv/course-hub/site.toml jupyterhub -f hub/jupyterhub_config.py

``hub/trial-up`` brings up a trial hub on one machine against the one-node Slurm of
``.ci/slurm-up``.
"""
import os
import pwd
import tomllib

import batchspawner  # noqa: F401 - registers the hub's API handler the servers report their port to
from traitlets import List, Unicode, default

c = get_config()  # noqa: F821 - provided by JupyterHub

HERE = os.path.dirname(os.path.abspath(__file__))
SITE_PATH = os.environ.get("COURSE_HUB_SITE") or os.path.join(HERE, "site.toml")
with open(SITE_PATH, "rb") as f:
    SITE = tomllib.load(f)
HUB, SLURM, COURSE = SITE.get("hub", {}), SITE.get("slurm", {}), SITE.get("course", {})

INSTRUCTORS = set(HUB.get("instructors", []))
STUDENTS = set(HUB.get("students", []))
ENV_BIN = os.path.join(COURSE["environment"], "bin")
STATE = HUB.get("state_dir", "/srv/course-hub")
USER_CONFIG = os.path.join(HERE, "user-config")   # the notebook servers' Jupyter/nbgrader settings, per role

# ---------------------------------------------------------------- the hub itself
c.JupyterHub.bind_url = HUB.get("bind_url", "http://:8000")
c.JupyterHub.hub_ip = HUB.get("hub_ip", "0.0.0.0")
if HUB.get("hub_connect_ip"):
    c.JupyterHub.hub_connect_ip = HUB["hub_connect_ip"]
if HUB.get("hub_port"):
    c.JupyterHub.hub_port = int(HUB["hub_port"])
if HUB.get("proxy_api_port"):
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(HUB['proxy_api_port'])}"
c.JupyterHub.db_url = "sqlite:///" + os.path.join(STATE, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(STATE, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(STATE, "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = os.path.join(STATE, "proxy.pid")
c.JupyterHub.cleanup_servers = True     # stopping the hub cancels the servers' jobs

# ---------------------------------------------------------------- who logs in
AUTHENTICATORS = {"pam": "jupyterhub.auth.PAMAuthenticator"}
c.JupyterHub.authenticator_class = AUTHENTICATORS.get(HUB.get("authenticator", "pam"), HUB.get("authenticator"))
c.Authenticator.admin_users = INSTRUCTORS
if STUDENTS:
    c.Authenticator.allowed_users = STUDENTS | INSTRUCTORS
else:
    c.Authenticator.allow_all = True
# Local accounts only: the hub never creates a Unix user; the cluster's accounts must exist.
c.LocalAuthenticator.create_system_users = False


# ---------------------------------------------------------------- each server: a Slurm job
class CourseSlurmSpawner(batchspawner.SlurmSpawner):
    """SlurmSpawner with the course's roles: instructors start in their course folder with the
    formgrader, students in their home folder without it."""

    req_workdir = Unicode(help="the folder the server starts in (--chdir)")
    req_sbatch_args = List(Unicode(), help="more #SBATCH lines").tag(config=True)

    def role(self) -> str:
        return "instructor" if self.user.name in INSTRUCTORS else "student"

    def course_dir(self) -> str:
        return COURSE["course_dir"].format(username=self.user.name)

    @default("req_workdir")
    def _req_workdir_default(self):
        return self.course_dir() if self.role() == "instructor" else pwd.getpwnam(self.user.name).pw_dir

    def get_env(self):
        env = super().get_env()
        # The course environment first, then the hub's own PATH (sbatch, squeue, the submit prefix).
        env["PATH"] = os.pathsep.join([ENV_BIN, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        env["VIRTUAL_ENV"] = COURSE["environment"]
        # Read by the config files of hub/user-config/<role>/ (nbgrader's exchange, the course id).
        env["JUPYTER_CONFIG_PATH"] = os.path.join(USER_CONFIG, self.role())
        env["COURSE_EXCHANGE"] = COURSE["exchange"]
        env["COURSE_ID"] = COURSE.get("course_id", "modern-gpu-kernels")
        if self.role() == "instructor":
            env["COURSE_DIR"] = self.course_dir()
        return env


c.JupyterHub.spawner_class = CourseSlurmSpawner

with open(os.path.join(HERE, "slurm-server.sh")) as f:
    c.CourseSlurmSpawner.batch_script = f.read()
c.CourseSlurmSpawner.exec_prefix = HUB.get("submit_prefix", "sudo -E -u {username}")
c.CourseSlurmSpawner.req_partition = SLURM.get("partition", "")
c.CourseSlurmSpawner.req_gres = SLURM.get("gres", "gpu:1")
c.CourseSlurmSpawner.req_runtime = str(SLURM.get("time", "4:00:00"))
c.CourseSlurmSpawner.req_nprocs = str(SLURM.get("cpus", ""))
c.CourseSlurmSpawner.req_memory = str(SLURM.get("mem", ""))
c.CourseSlurmSpawner.req_account = SLURM.get("account", "")
c.CourseSlurmSpawner.req_sbatch_args = list(SLURM.get("sbatch_args", []))
c.CourseSlurmSpawner.req_prologue = "\n".join(SLURM.get("setup", []))
c.CourseSlurmSpawner.start_timeout = int(SLURM.get("start_timeout", 600))
c.CourseSlurmSpawner.http_timeout = 120
c.Spawner.cmd = [os.path.join(ENV_BIN, "jupyterhub-singleuser")]
c.CourseSlurmSpawner.batchspawner_singleuser_cmd = os.path.join(ENV_BIN, "batchspawner-singleuser")
c.Spawner.default_url = "/tree"
