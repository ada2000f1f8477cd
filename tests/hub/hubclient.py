"""What the course hub's tests need to use a real hub as people do: log in, start and stop a
server (a Slurm job), call a server's APIs (Jupyter's contents and kernels, nbgrader's assignment
list and formgrader), run a notebook's cells in the server's kernel, and say what the hub and
Slurm logged when something does not come."""
from __future__ import annotations

import asyncio
import datetime
import glob
import json
import os
import subprocess
import time
import uuid
from urllib.parse import quote, urlparse

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM_LOGS = ("/var/log/slurm/slurmctld.log", "/var/log/slurm/slurmd.log")


class HubFailure(AssertionError):
    pass


def tail(path: str, n: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"({path}: {e})\n"


class Hub:
    """A trial hub brought up by hub/trial-up in ``folder``."""

    def __init__(self, url: str, folder: str):
        self.url = url.rstrip("/")
        self.folder = folder
        self.passwords = dict(line.split() for line in open(os.path.join(folder, "passwords")) if line.strip())

    def home(self, user: str) -> str:
        return os.path.join(self.folder, "home", user)

    def diagnostics(self, users=()) -> str:
        """The hub's log, each user's server job logs, the queue and Slurm's logs (for failure messages)."""
        parts = [f"--- hub log ({self.folder}/hub.log), last lines:\n{tail(os.path.join(self.folder, 'hub.log'), 60)}"]
        for user in users:
            for log in sorted(glob.glob(os.path.join(self.home(user), ".course-hub-server-*.log")))[-2:]:
                parts.append(f"--- {user}'s server job log {log}:\n{tail(log, 40)}")
        try:
            q = subprocess.run(["squeue", "-o", "%i %u %j %T %R"], capture_output=True, text=True, timeout=20)
            parts.append(f"--- squeue:\n{q.stdout}{q.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            parts.append(f"--- squeue failed: {e}")
        for log in SLURM_LOGS:
            parts.append(f"--- {log}, last lines:\n{tail(log, 15)}")
        return "\n".join(parts)

    def login(self, user: str) -> "User":
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30).raise_for_status()
        r = s.post(f"{self.url}/hub/login?next=", timeout=60, allow_redirects=False,
                   data={"username": user, "password": self.passwords[user], "_xsrf": s.cookies.get("_xsrf", "")})
        if r.status_code not in (302, 303):
            raise HubFailure(f"{user} could not log in to the hub (HTTP {r.status_code}): {r.text[:500]}\n"
                             + self.diagnostics())
        r = s.post(f"{self.url}/hub/api/users/{user}/tokens", json={"note": "course hub test", "expires_in": 7200},
                   headers={"X-XSRFToken": s.cookies.get("_xsrf", path="/hub/") or s.cookies.get("_xsrf", "")},
                   timeout=60)
        if r.status_code != 201:
            raise HubFailure(f"no API token for {user} (HTTP {r.status_code}): {r.text[:500]}")
        return User(self, user, r.json()["token"])


class User:
    def __init__(self, hub: Hub, name: str, token: str):
        self.hub, self.name, self.token = hub, name, token
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {token}"
        self.base = f"{hub.url}/user/{name}"

    # ------------------------------------------------ the server: a Slurm job
    def model(self) -> dict:
        r = self.http.get(f"{self.hub.url}/hub/api/users/{self.name}", timeout=60)
        r.raise_for_status()
        return r.json()

    def start(self, timeout: float = 420) -> None:
        r = self.http.post(f"{self.hub.url}/hub/api/users/{self.name}/server", timeout=120)
        if r.status_code not in (201, 202, 400):   # 400: already running
            raise HubFailure(f"the hub refused to start {self.name}'s server (HTTP {r.status_code}): {r.text[:500]}\n"
                             + self.hub.diagnostics([self.name]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.model().get("servers", {}).get("")
            if server and server.get("ready"):
                return
            if not server and r.status_code != 400 and time.monotonic() > deadline - timeout + 10:
                raise HubFailure(f"{self.name}'s server stopped while starting\n" + self.hub.diagnostics([self.name]))
            time.sleep(2)
        raise HubFailure(f"{self.name}'s server was not ready within {timeout:.0f} s\n"
                         + self.hub.diagnostics([self.name]))

    def stop(self, timeout: float = 120) -> None:
        self.http.delete(f"{self.hub.url}/hub/api/users/{self.name}/server", timeout=120)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.model().get("servers"):
                return
            time.sleep(2)
        raise HubFailure(f"{self.name}'s server did not stop within {timeout:.0f} s\n" + self.hub.diagnostics([self.name]))

    def job(self) -> dict:
        """The user's Slurm job as squeue shows it: id, state, partition, gres, time limit."""
        p = subprocess.run(["squeue", "-h", "-u", self.name, "-o", "%i|%T|%P|%b|%l|%j"], capture_output=True,
                           text=True, timeout=30)
        rows = [dict(zip(("id", "state", "partition", "gres", "time", "name"), ln.split("|")))
                for ln in p.stdout.splitlines() if ln.strip()]
        return rows[0] if rows else {}

    # ------------------------------------------------ the server's APIs
    def api(self, method: str, path: str, timeout: float = 120, expect=(200, 201), **kw) -> requests.Response:
        r = self.http.request(method, f"{self.base}/{path.lstrip('/')}", timeout=timeout, **kw)
        if r.status_code not in expect:
            raise HubFailure(f"{method} {path} as {self.name}: HTTP {r.status_code}: {r.text[:1500]}\n"
                             + self.hub.diagnostics([self.name]))
        return r

    def nbgrader(self, path: str, timeout: float = 900, **kw) -> dict:
        """A formgrader or assignment-list call; fails with nbgrader's own log when it says it failed."""
        data = self.api("POST", path, timeout=timeout, **kw).json()
        if isinstance(data, dict) and data.get("success") is False:
            raise HubFailure(f"{path} as {self.name} failed:\n{data.get('error') or data.get('value')}\n"
                             f"{data.get('log', '')}")
        return data

    def read(self, path: str) -> dict:
        return self.api("GET", f"api/contents/{quote(path)}?content=1").json()

    def write_notebook(self, path: str, nb: dict) -> None:
        self.api("PUT", f"api/contents/{quote(path)}", json={"type": "notebook", "format": "json", "content": nb})

    # ------------------------------------------------ running a notebook in the server's kernel
    def run_notebook(self, path: str, skip=lambda cell: False, cell_timeout: float = 900) -> dict:
        """Run the notebook's code cells in order in a kernel of the server (as Run All does; an
        error does not stop the rest), keep their outputs, save the notebook; returns it."""
        nb = self.read(path)["content"]
        session = self.api("POST", "api/sessions", json={"path": path, "type": "notebook", "name": "",
                                                          "kernel": {"name": "python3"}}).json()
        kernel = session["kernel"]["id"]
        try:
            asyncio.run(self._run_cells(kernel, [c for c in nb["cells"] if c["cell_type"] == "code" and not skip(c)],
                                        cell_timeout))
        finally:
            self.api("DELETE", f"api/sessions/{session['id']}", expect=(204,))
        self.write_notebook(path, nb)
        return nb

    async def _run_cells(self, kernel: str, cells: list[dict], cell_timeout: float) -> None:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect
        u = urlparse(self.base)
        ws_url = f"ws://{u.netloc}{u.path}/api/kernels/{kernel}/channels?session_id={uuid.uuid4().hex}"
        conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {self.token}"}),
                                       max_message_size=256 * 1024 * 1024)
        try:
            for count, cell in enumerate(cells, 1):
                cell["outputs"], cell["execution_count"] = [], count
                msg_id = uuid.uuid4().hex
                source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                await conn.write_message(json.dumps({
                    "header": {"msg_id": msg_id, "username": self.name, "session": uuid.uuid4().hex,
                               "msg_type": "execute_request", "version": "5.3",
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
                    "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                    "content": {"code": source, "silent": False, "store_history": True, "user_expressions": {},
                                "allow_stdin": False, "stop_on_error": False}}))
                deadline = time.monotonic() + cell_timeout
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise HubFailure(f"a cell of {self.name}'s notebook ran past {cell_timeout:.0f} s:\n{source[:300]}")
                    raw = await asyncio.wait_for(conn.read_message(), timeout=left)
                    if raw is None:
                        raise HubFailure(f"the kernel's connection closed while running:\n{source[:300]}\n"
                                         + self.hub.diagnostics([self.name]))
                    msg = json.loads(raw)
                    if msg.get("parent_header", {}).get("msg_id") != msg_id or msg.get("channel") != "iopub":
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream":
                        cell["outputs"].append({"output_type": "stream", "name": content["name"], "text": content["text"]})
                    elif kind in ("execute_result", "display_data"):
                        out = {"output_type": kind, "data": content["data"], "metadata": content.get("metadata", {})}
                        if kind == "execute_result":
                            out["execution_count"] = count
                        cell["outputs"].append(out)
                    elif kind == "error":
                        cell["outputs"].append({"output_type": "error", "ename": content["ename"],
                                                "evalue": content["evalue"], "traceback": content["traceback"]})
                    elif kind == "status" and content["execution_state"] == "idle":
                        break
        finally:
            conn.close()


def text_of(cell: dict) -> str:
    """What a code cell shows: its streams, its results' plain text, its error."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append(o["text"])
        elif o["output_type"] in ("execute_result", "display_data"):
            out.append(str(o["data"].get("text/plain", "")))
        elif o["output_type"] == "error":
            out.append(f"{o['ename']}: {o['evalue']}")
    return "".join(out)
