"""The course hub as a class uses it, on the one-node Slurm of .ci/slurm-up.

hub/trial-up brings up a real JupyterHub (hub/jupyterhub_config.py, PAM logins of local users)
with an instructor and two students; every notebook server is a Slurm job. The instructor
generates and releases Lab 1 from the formgrader; each student fetches it from the assignment
list, writes answers (ann the reference's, bo one part wrong), runs every cell in the server's
kernel (on CPU here: the GPU parts' check cells say skipped) and submits; the instructor collects,
autogrades (the course's jailed grader) and releases feedback; each student fetches their own.
The student's notebook and the formgrader are opened in headless Chromium; with
COURSE_HUB_SCREENSHOTS=DIR their screenshots are kept there (hub/screenshots/ for the README).

Needs root, a Slurm cluster with gpu generic resources, configurable-http-proxy, Chromium and
chromedriver, and a course environment every user can run (COURSE_HUB_ENVIRONMENT, default this
interpreter's environment). Without them the tests skip with the reason, or fail where
COURSE_HUB_REQUIRED=1 (.ci/run sets it). One run serves every test.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import hubclient
from slurmhere import cluster_or_reason
from hubclient import ROOT, text_of

pytestmark = pytest.mark.hub

LAB = "lab1_roofline"
COURSE_ID = "modern-gpu-kernels"
INSTRUCTOR = "hubt-teach"
ANN, BO = "hubt-ann", "hubt-bo"
NOTEBOOK = f"{LAB}/{LAB}.ipynb"
SOLUTION = os.path.join(ROOT, "solutions", LAB, f"{LAB}.ipynb")
WRONG_FLOPS = ('return flops / 2 if op["causal"] else flops', "return flops")   # bo's mistake in part a_flops
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT_MAX_BYTES = 200_000


def _missing(reason):
    if os.environ.get("COURSE_HUB_REQUIRED") == "1":
        pytest.fail(f"the course hub's tests cannot run: {reason}")
    pytest.skip(reason)


def _environment():
    env = os.environ.get("COURSE_HUB_ENVIRONMENT") or sys.prefix
    probe = subprocess.run(["runuser", "-u", "nobody", "--", os.path.join(env, "bin", "python"), "-c",
                            "import jupyterhub, batchspawner, nbgrader, grader"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        _missing(f"an ordinary user cannot run the course environment {env} (set COURSE_HUB_ENVIRONMENT to one "
                 f"every user can run, with the hub extra): {probe.stderr.strip()[-500:]}")
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hub():
    if os.geteuid() != 0:
        _missing("the trial hub makes local users and runs as root")
    reason = cluster_or_reason()
    if reason:
        _missing(reason)
    for exe, how in (("configurable-http-proxy", "npm install -g configurable-http-proxy"),
                     (CHROMIUM, "apt-get install chromium"), (CHROMEDRIVER, "apt-get install chromium-driver")):
        if not shutil.which(exe):
            _missing(f"{exe} is missing ({how})")
    env = _environment()
    folder = os.path.join(tempfile.gettempdir(), f"course-hub-test-{os.getpid()}")
    up = subprocess.run([os.path.join(ROOT, "hub", "trial-up"), "--dir", folder, "--port", str(_free_port()),
                         "--students", f"{ANN} {BO}", "--instructor", INSTRUCTOR, "--environment", env],
                        capture_output=True, text=True, timeout=600)
    try:
        assert up.returncode == 0, f"hub/trial-up failed:\n{up.stdout}{up.stderr}"
        yield hubclient.Hub(up.stdout.strip().splitlines()[-1], folder)
    finally:
        down = subprocess.run([os.path.join(ROOT, "hub", "trial-up"), "--down", "--dir", folder],
                              capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, f"hub/trial-up --down failed:\n{down.stdout}{down.stderr}"


def _answers(wrong_flops=False):
    """{grade id: source} of the reference's answer cells (bo: part a_flops wrong)."""
    with open(SOLUTION) as f:
        cells = json.load(f)["cells"]
    out = {}
    for cell in cells:
        md = cell["metadata"].get("nbgrader", {})
        if md.get("solution"):
            lines = "".join(cell["source"]).splitlines(keepends=True)
            out[md["grade_id"]] = "".join(ln for ln in lines if not re.match(r"\s*### (BEGIN|END) SOLUTION", ln))
    if wrong_flops:
        assert WRONG_FLOPS[0] in out["a_flops"]
        out["a_flops"] = out["a_flops"].replace(*WRONG_FLOPS)
    return out


def _check_cell(nb, part):
    return next(c for c in nb["cells"] if f'check("{LAB}", "{part}"' in "".join(c["source"]))


# ---------------------------------------------------------------- the browser

def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,760", "--hide-scrollbars"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _browser_login(driver, hub, user):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.delete_all_cookies()
    driver.get(f"{hub.url}/hub/login")
    WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.ID, "username_input"))
    driver.find_element(By.ID, "username_input").send_keys(user)
    driver.find_element(By.ID, "password_input").send_keys(hub.passwords[user])
    driver.find_element(By.ID, "login_submit").click()
    WebDriverWait(driver, 120).until(lambda d: f"/user/{user}/" in d.current_url,
                                     message=f"{user}'s login in the browser did not reach the server")


def _page_text_with(driver, url, wanted, timeout=180):
    """Open url; wait until the page shows every string of wanted; return the page's text."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url)
    try:
        WebDriverWait(driver, timeout).until(
            lambda d: all(w in d.find_element(By.TAG_NAME, "body").text for w in wanted))
    except TimeoutException:
        raise AssertionError(f"{url} did not show {wanted} within {timeout} s; it shows:\n"
                             f"{driver.find_element(By.TAG_NAME, 'body').text[:3000]}") from None
    return driver.find_element(By.TAG_NAME, "body").text


def _screenshot(driver, name, folder):
    """A small PNG of the page (a 64-colour palette), in folder; returns its path."""
    from PIL import Image
    raw = os.path.join(folder, name + ".raw.png")
    driver.save_screenshot(raw)
    path = os.path.join(folder, name + ".png")
    Image.open(raw).convert("RGB").quantize(colors=64).save(path, optimize=True)
    os.remove(raw)
    return path


# ---------------------------------------------------------------- the class, once

@pytest.fixture(scope="module")
def course(hub):
    """The whole term of Lab 1 on the hub; what each step showed, for the tests below."""
    shots = os.environ.get("COURSE_HUB_SCREENSHOTS") or tempfile.mkdtemp(prefix="course-hub-shots-")
    os.makedirs(shots, exist_ok=True)
    run = {"jobs": {}, "ran": {}, "feedback": {}, "screenshots": {}, "pages": {}}
    query = f"course_id={COURSE_ID}&assignment_id={LAB}"

    # The instructor: generate Lab 1 from the source, add the students, release it.
    teach = hub.login(INSTRUCTOR)
    teach.start()
    run["jobs"][INSTRUCTOR] = teach.job()
    for student in (ANN, BO):
        teach.api("PUT", f"formgrader/api/student/{student}", json={"first_name": student, "last_name": "", "email": ""})
    teach.nbgrader(f"formgrader/api/assignment/{LAB}/assign")
    teach.nbgrader(f"formgrader/api/assignment/{LAB}/release")
    teach.stop()   # the one-node cluster has few CPUs: one server at a time beside the instructor's

    # Each student: fetch, answer, run every cell (the last one grades the saved notebook: skipped), submit.
    for student, wrong in ((ANN, False), (BO, True)):
        user = hub.login(student)
        user.start()
        run["jobs"][student] = user.job()
        fetched = user.nbgrader(f"assignments/fetch?{query}")["value"]
        run.setdefault("fetched", {})[student] = fetched
        nb = user.read(NOTEBOOK)["content"]
        answers = _answers(wrong)
        for cell in nb["cells"]:
            gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if gid in answers:
                cell["source"] = answers[gid]
        user.write_notebook(NOTEBOOK, nb)
        run["ran"][student] = user.run_notebook(NOTEBOOK, skip=lambda c: "grade_notebook(" in "".join(c["source"]))
        user.nbgrader(f"assignments/submit?{query}")
        if student == ANN:
            r = user.http.get(f"{user.base}/formgrader/api/status", timeout=60)
            run["student_formgrader_status"] = r.status_code
            ann = user
        else:   # bo's server is up: ann's own token must not open it
            r = ann.http.get(f"{user.base}/api/contents/{NOTEBOOK}", timeout=60, allow_redirects=False)
            run["other_server_status"] = r.status_code
        user.stop()

    # The instructor: collect, autograde each, feedback; the formgrader's page in the browser.
    teach.start()
    teach.nbgrader(f"formgrader/api/assignment/{LAB}/collect")
    for student in (ANN, BO):
        teach.nbgrader(f"formgrader/api/submission/{LAB}/{student}/autograde", timeout=1800)
    teach.nbgrader(f"formgrader/api/assignment/{LAB}/generate_feedback")
    teach.nbgrader(f"formgrader/api/assignment/{LAB}/release_feedback")
    run["submissions"] = {s["student"]: s for s in teach.api("GET", f"formgrader/api/submissions/{LAB}").json()}
    driver = _browser()
    try:
        _browser_login(driver, hub, INSTRUCTOR)
        run["pages"]["formgrader"] = _page_text_with(
            driver, f"{hub.url}/user/{INSTRUCTOR}/formgrader/manage_submissions/{LAB}", [ANN, BO])
        run["screenshots"]["formgrader"] = _screenshot(driver, "formgrader", shots)
    finally:
        driver.quit()
    teach.stop()

    # Each student: fetch their feedback; ann's notebook in the browser.
    for student in (ANN, BO):
        user = hub.login(student)
        user.start()
        user.nbgrader(f"assignments/fetch_feedback?{query}")
        found = {}
        for stamp in user.read(f"{LAB}/feedback")["content"]:
            for item in user.read(stamp["path"])["content"]:
                found[item["path"]] = user.read(item["path"])["content"]
        run["feedback"][student] = found
        if student == ANN:
            driver = _browser()
            try:
                _browser_login(driver, hub, ANN)
                run["pages"]["notebook"] = _page_text_with(
                    driver, f"{hub.url}/user/{ANN}/notebooks/{NOTEBOOK}", ["Lab 1: the roofline"])
                # The notebook renders only the cells in view: scroll down to part b's check cells.
                for _ in range(80):
                    found = driver.execute_script(
                        "const el = [...document.querySelectorAll('.jp-OutputArea-output')]"
                        f".find(e => e.textContent.includes('[SKIP] {LAB}/b_correct'));"
                        "if (el) { el.scrollIntoView({block: 'center'}); return true; }"
                        "const box = document.querySelector('.jp-WindowedPanel-outer');"
                        "if (box) box.scrollBy(0, 400); return false;")
                    time.sleep(0.5)
                    if found:
                        break
                time.sleep(2)
                run["pages"]["notebook_shown"] = driver.execute_script("return document.body.innerText")
                run["screenshots"]["notebook"] = _screenshot(driver, "student-notebook", shots)
            finally:
                driver.quit()
        user.stop()
    return run


# ---------------------------------------------------------------- what it must show

def test_each_server_is_a_slurm_job_with_one_gpu_as_its_user(course):
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout
    default = next(p.rstrip("*") for p in partition.split() if p.endswith("*"))
    for user in (INSTRUCTOR, ANN, BO):
        job = course["jobs"][user]
        assert job, f"squeue -u {user} showed no job while {user}'s server ran"
        assert job["state"] == "RUNNING" and job["name"] == f"course-hub-{user}", job
        assert job["gres"].endswith("gpu:1") and job["partition"] == default and job["time"] == "2:00:00", job


def test_students_run_lab1_on_cpu_and_gpu_parts_say_skipped(course):
    ann, bo = course["ran"][ANN], course["ran"][BO]
    for part in ("a_flops", "a_bytes", "a_predict", "b_build", "c_roofline"):
        assert f"[PASS] {LAB}/{part}" in text_of(_check_cell(ann, part)), text_of(_check_cell(ann, part))
    for nb in (ann, bo):
        for part in ("b_correct", "b_speed"):
            assert re.search(rf"\[SKIP\] {LAB}/{part}: needs a GPU", text_of(_check_cell(nb, part))), \
                text_of(_check_cell(nb, part))
    assert f"[PARTIAL] {LAB}/a_flops" in text_of(_check_cell(bo, "a_flops")), text_of(_check_cell(bo, "a_flops"))
    assert course["fetched"][ANN][0]["status"] == "fetched"


def test_students_get_no_formgrader_and_no_other_server(course):
    assert course["student_formgrader_status"] == 404, course["student_formgrader_status"]
    assert course["other_server_status"] == 403, course["other_server_status"]


def test_autograde_scores_each_submission_with_the_course_grader(course, hub):
    subs = course["submissions"]
    # ann: every part a CPU can grade; bo: part a_flops 5/6 cases (1.67 -> 2 x 5/6 rounded in the cell).
    assert (subs[ANN]["score"], subs[ANN]["max_score"], subs[ANN]["autograded"]) == (10.0, 16.0, True), subs[ANN]
    assert 9.0 < subs[BO]["score"] < 10.0 and subs[BO]["autograded"], subs[BO]
    report = os.path.join(hub.home(INSTRUCTOR), "modern-gpu-kernels-course", "grader-results", "nbgrader", ANN,
                          f"{LAB}.json")
    with open(report) as f:
        sandbox = {r["part"]: r["measurements"].get("sandbox", "") for r in json.load(f)["results"]}
    assert "jail" in sandbox["a_flops"], sandbox


def test_each_student_sees_only_their_own_feedback(course, hub):
    for student, other in ((ANN, BO), (BO, ANN)):
        files = course["feedback"][student]
        assert list(files) and all(p.endswith(f"{LAB}.html") for p in files), files
        assert len(files) == 1, f"{student} got feedback files {sorted(files)}"
        html = next(iter(files.values()))
        score = course["submissions"][student]["score"]
        total = re.search(r"Score: ([\d.]+) / ([\d.]+)", html)   # the notebook's total comes first
        assert total and abs(float(total.group(1)) - score) < 0.01 and float(total.group(2)) == 16, \
            (score, re.findall(r"Score: [^<)]*", html)[:3])
    # The exchange's inbound (every submission) cannot be listed by a student.
    inbound = os.path.join(hub.folder, "exchange", COURSE_ID, "inbound")
    peek = subprocess.run(["runuser", "-u", ANN, "--", "ls", inbound], capture_output=True, text=True)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek.stdout + peek.stderr
    peek = subprocess.run(["runuser", "-u", ANN, "--", "ls", hub.home(BO)], capture_output=True, text=True)
    assert peek.returncode != 0, f"{ANN} can list {BO}'s home: {peek.stdout}"


def test_pages_in_a_real_browser(course):
    page = course["pages"]["formgrader"]
    for student in (ANN, BO):
        score = course["submissions"][student]["score"]
        row = next((ln for ln in page.splitlines() if student in ln), "")
        assert re.search(rf"\b{score:g}(\.0+)? / 16", row) or f"{score:.2f}" in row, (student, score, page[:2000])
    shown = course["pages"]["notebook_shown"]
    assert f"[PASS] {LAB}/b_build" in shown and f"[SKIP] {LAB}/b_correct: needs a GPU" in shown, shown[-3000:]
    for name, path in course["screenshots"].items():
        size = os.path.getsize(path)
        assert 10_000 < size <= SCREENSHOT_MAX_BYTES, f"screenshot {name} {path}: {size} bytes"
