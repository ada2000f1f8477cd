"""Writing the student edition (``python -m grader release DIR``; see grader/edition/__init__.py):
recording the public tables from the labs' own grading functions, checking the reference
against them, copying what students get, and scanning the result for solution lines. Stays
with the instructors: the edition ships grader/edition/tables.py alone."""
from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from .. import dispatch, grading, sandbox, spec
from .tables import encode, grade_from_table


REPO_ROOT = sandbox.REPO_ROOT
SOLUTIONS = os.path.join(REPO_ROOT, "solutions")
MARKER = ".student-edition"

# Edits to copies of shared files, so that they fit the edition: (path, old, new, why, required).
PATCHES = [
    ("pyproject.toml", '"specs/*.lock"]', '"specs/*.lock", "public/*.json"]',
     "the public tables are package data", True),
    ("grader/run.py", 'SOLUTIONS_DIR = os.path.join(sandbox.REPO_ROOT, "solutions")',
     'SOLUTIONS_DIR = os.path.join(sandbox.REPO_ROOT, "assignments")   # the student edition: your notebooks',
     "check and compile default to the notebooks in assignments/", False),
    ("grader/cli.py", "'reference solutions (solutions/)'", "'your notebooks (assignments/)'",
     "check says which notebooks it grades by default", False),
]


class ReleaseError(Exception):
    pass


# ---------------------------------------------------------------- recording the public cases

class _NoSubmission:
    """The submission a part's grading function sees while its public cases are recorded: a
    declared question (grading.grade_question) and a figure call (grading.figure) are recorded
    without calling it; anything else that asks it for a function cannot be recorded."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        raise grading.NotRecordable(f"the grading function calls {name}() outside a declared question")


def _public_context(lab_spec, part):
    from .. import hardware, inputs
    from ..context import Context
    device = hardware.Device(False, "", None, "", "recording the public cases")
    return Context(lab_spec, part, inputs.PUBLIC_SEED, device, public_only=True)


class _CaseRecorder:
    """What ``grading.recording`` hands the declared questions' public calls (with their answers
    and comparison) and the figure calls to."""

    def __init__(self):
        self.cases: dict[str, list] = {}
        self.how: dict[str, dict] = {}
        self.extras: list[dict] = []

    def add(self, name, args, expected, how):
        self.cases.setdefault(name, []).append((tuple(args), expected))
        self.how[name] = how

    def figure(self, module, name, *args):
        self.extras.append({"kind": "figure", "fn": name, "args": encode(list(args))})
        return []


def _capture(grade, ctx) -> dict:
    """Run the part's grading function ``grade`` in public mode, its declared questions and
    figure calls recorded (``grading.recording``) instead of graded."""
    with grading.recording(_CaseRecorder()) as rec:
        grade(_NoSubmission(), ctx)
    if not rec.cases:
        raise grading.NotRecordable("the grading function declares no question")
    checks = [{"fn": fn, "compare": rec.how[fn],
               "cases": [[[encode(a) for a in args], encode(exp)] for args, exp in table]}
              for fn, table in rec.cases.items()]
    for chk in checks:                 # answers the table must not show: their hashes only
        if chk["fn"] in ctx.part.params.get("sealed_public", []):
            if chk["compare"].get("kind") != "same":
                raise ReleaseError(f"{ctx.lab.lab}/{ctx.part.id}: {chk['fn']} is sealed_public, but its answers are "
                                   f"compared by {chk['compare'].get('kind')!r}, not exactly")
            from . import tables
            chk["cases"], chk["compare"] = tables.seal_cases(chk["fn"], chk["cases"]), {"kind": "sealed"}
    return {"checks": checks, "extras": rec.extras}


def _own_tables(recorder, ctx) -> dict:
    """A part whose lab records its public cases itself (the hook ``PUBLIC_TABLES``): the lab's
    recorder is given the table toolkit (grader/edition/tables.py) and the public context, and
    names each check's comparison (compare.ANSWERS, or "layout")."""
    from . import tables
    entry = recorder(ctx, tables)
    for check in entry["checks"]:
        if check.get("compare", {}).get("kind") not in tables.COMPARE:
            raise ReleaseError(f"{ctx.lab.lab}/{ctx.part.id}: check of {check['fn']} names no known comparison "
                               f"({', '.join(tables.COMPARE)})")
    return entry


def _lab_modules() -> set[str]:
    return {f"grader.labs.{lab}" for lab in spec.lab_names()}


def _shipped_target(fn) -> str | None:
    """``module:qualname`` of a grading function that the edition ships, else None."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if (not mod or not mod.startswith("grader.") or mod in _lab_modules() or mod == __name__
            or "<" in qual):
        return None
    return f"{mod}:{qual}"


def record_lab(lab: str, progress=print) -> dict:
    """The public table of a lab: recorded CPU parts, shipped grading functions, the rest, and the
    sealed descriptor tiles of its build parts."""
    from . import tables as tables_mod
    lab_module = importlib.import_module(f"grader.labs.{lab}")
    lab_spec = spec.load(lab)
    own = getattr(lab_module, "GRADERS", {})
    questions = getattr(lab_module, "QUESTIONS", {})
    table = {"lab": lab, "format": 1, "parts": {}, "shipped": {}, "default_runner": [], "course_grader_only": [],
             "hand_recorded": []}
    sealed = {pid: tables_mod.seal_tiles(pid, tiles) for pid, tiles in getattr(lab_module, "DESC_FIELDS", {}).items()}
    if sealed:
        table["desc_fields"] = sealed          # the build parts' descriptor tiles, hashed (tables.SealedTile)
    places = {pid: tables_mod.seal_places(pid, p) for pid, p in getattr(lab_module, "ACC_PLACES", {}).items()}
    if places:
        table["acc_places"] = places           # the epilogues' accumulator places, hashed (tables.SealedPlaces)
    for part in lab_spec.parts:
        entry = None
        if not part.needs_gpu and part.kind in ("function", "artifact") and (part.id in own or part.id in questions):
            ctx = _public_context(lab_spec, part)
            recorder = getattr(lab_module, "PUBLIC_TABLES", {}).get(part.id)
            try:
                entry = _own_tables(recorder, ctx) if recorder else _capture(dispatch.grading_function(lab, part), ctx)
            except grading.NotRecordable:
                if recorder:
                    raise
                entry = None
            except (AttributeError, KeyError, TypeError) as e:
                if not recorder:
                    raise
                raise ReleaseError(f"{lab}/{part.id}: its PUBLIC_TABLES recorder failed: {type(e).__name__}: {e}") from e
        if entry is not None:
            table["parts"][part.id] = entry
            if recorder:
                table["hand_recorded"].append(part.id)
            continue
        target = _shipped_target(own.get(part.id))
        if target:
            table["shipped"][part.id] = target
        elif part.id not in own and part.id not in questions and _has_default_runner(lab, part):
            table["default_runner"].append(part.id)
        else:
            table["course_grader_only"].append(part.id)
    return table


def _has_default_runner(lab: str, part) -> bool:
    """Graded by the default runner of its kind (grader/runners.py, shipped), as grader/dispatch.py
    falls back to for a part its lab module leaves out."""
    try:
        dispatch.grading_function(lab, part)
    except KeyError:
        return False
    return True


def _import_notebook(notebook: str, name: str):
    import importlib.util

    import atexit

    from .. import submission
    folder = tempfile.mkdtemp(prefix="grader-release-")
    atexit.register(shutil.rmtree, folder, True)      # the file must outlive the import: TIRx reads it
    written = submission.write_module(notebook, folder)
    path = getattr(written, "path", written)
    mod_spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def self_check(lab: str, table: dict, progress=print) -> None:
    """Grade the reference solution from the table: every recorded part must pass. A
    hand-recorded part that does not is dropped (with a warning); any other is an error."""
    lab_spec = spec.load(lab)
    notebook = os.path.join(SOLUTIONS, lab, lab_spec.notebook)
    reference = _import_notebook(notebook, f"_release_reference_{lab}")
    for part_id in list(table["parts"]):
        ctx = _public_context(lab_spec, lab_spec.part(part_id))
        try:
            out = grade_from_table(table["parts"][part_id], reference, ctx)
            ok, why = out.fraction >= 1.0, out.message
        except Exception as e:  # noqa: BLE001 - reported below
            ok, why = False, f"{type(e).__name__}: {e}"
        if ok:
            continue
        if part_id in table["hand_recorded"]:
            progress(f"  warning: {lab}/{part_id}: the reference solution fails its recorded table ({why[:300]}); "
                     "left to the course grader")
            del table["parts"][part_id]
            table["hand_recorded"].remove(part_id)
            table["course_grader_only"].append(part_id)
        else:
            raise ReleaseError(f"{lab}/{part_id}: the reference solution fails its recorded public cases: {why[:500]}")


# ---------------------------------------------------------------- what must not leak

def _cells(notebook: str) -> list[str]:
    with open(notebook) as f:
        nb = json.load(f)
    return [c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in nb["cells"]]


# A statement that only calls something with constants or plain names (`T.cuda.cta_sync()`,
# `T.ptx.fence.proxy_async("shared::cta")`, `fig.savefig(path)`), or a loop header over such a
# call (`for i in range(8):`). It names the API that the lectures teach and the skeletons'
# comments ask for, not a solution.
_ARG = r"""(?:\w+=)?(?:-?[\d.]+|"[^"]*"|'[^']*'|[A-Za-z_]\w*)"""
_CALL = rf"[A-Za-z_][\w.]*\(\s*(?:{_ARG}\s*(?:,\s*{_ARG}\s*)*,?)?\)"
TRIVIAL = re.compile(rf"^(?:{_CALL}|for \w+(?:, \w+)* in {_CALL}:)$")


def trivial(line: str) -> bool:
    return bool(TRIVIAL.match(re.sub(r"\s+#.*$", "", line.strip())))


def regions(notebook: str) -> tuple[list[str], list[str]]:
    """(lines inside the solution and hidden-test regions, lines outside them), stripped: the one
    reader of a notebook's nbgrader regions (the release and the leak tests use it)."""
    inside_lines, outside_lines = [], []
    for src in _cells(notebook):
        inside = False
        for line in src.splitlines():
            if re.search(r"### (BEGIN|END) (SOLUTION|HIDDEN TESTS)", line):
                inside = "BEGIN" in line
                continue
            (inside_lines if inside else outside_lines).append(line.strip())
    return inside_lines, outside_lines


def solution_lines(notebook: str) -> list[str]:
    """Every line between BEGIN/END SOLUTION and BEGIN/END HIDDEN TESTS of a notebook that says
    something: longer than 12 characters, not a comment, not trivial()."""
    return [s for s in regions(notebook)[0] if len(s) > 12 and not s.startswith("#") and not trivial(s)]


def secret_lines(root: str = REPO_ROOT) -> dict[str, str]:
    """Solution line -> its lab, for every lab; less the lines found in the given code of the
    lab's own notebook (a builder repeating a line of a given macro) and the lines that another
    lab's student notebook or lecture gives (a later lab's skeleton gives code an earlier lab
    asked for: lab 4 allocates shared memory the way lab 2's solution does; lab 4's lecture shows
    the `if T.ptx.elect_sync():` that lab 5's kernels use). A line counts as given when it is
    part of a given line (a continuation line such as ``dispatch="tma_auto")`` ends many)."""
    labs = spec.lab_names()

    def public_text(lab: str) -> str:
        texts = _cells(os.path.join(root, "assignments", lab, spec.load(lab).notebook))
        lecture = os.path.join(root, "lectures", lab, "index.md")
        if os.path.isfile(lecture):
            with open(lecture) as f:
                texts.append(f.read())
        return "\n".join(line.strip() for src in texts for line in src.splitlines())
    given = {lab: public_text(lab) for lab in labs}
    secret = {}
    for lab in labs:
        notebook = os.path.join(root, "solutions", lab, spec.load(lab).notebook)
        own = "\n".join(regions(notebook)[1])
        for s in solution_lines(notebook):
            if s not in own and not any(s in given[other] for other in labs if other != lab):
                secret.setdefault(s, lab)
    return secret


def leaks(dest: str) -> list[str]:
    """Solution text or reference code in the edition: one message each."""
    secret = secret_lines()
    found = []
    for dirpath, dirnames, files in os.walk(dest):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "_build", "generated", ".git")]
        if os.path.relpath(dirpath, dest).split(os.sep)[0] == "solutions":
            found.append("a solutions/ folder")
        for f in files:
            path = os.path.join(dirpath, f)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (UnicodeDecodeError, OSError):
                continue
            rel = os.path.relpath(path, dest)
            if re.search(r"^\s*def ref_", text, re.M):
                found.append(f"{rel}: defines ref_* functions")
            if "BEGIN SOLUTION" in text or "BEGIN HIDDEN TESTS" in text:
                found.append(f"{rel}: nbgrader solution or hidden-test markers")
            for s, lab in secret.items():
                if s in text:
                    found.append(f"{rel}: a solution line of {lab}: {s[:80]!r}")
                    break
    return found


# ---------------------------------------------------------------- writing the edition

STUDENT_README = """\
# Modern GPU Kernels: Hopper and Blackwell in TIRx (student edition)

Labs on writing fast GPU kernels for NVIDIA Hopper (H100/H200, `sm_90a`) and Blackwell (B200,
`sm_100a`) in TIRx, the kernel language of Apache TVM (`tvm.tirx`). This is the students'
edition of the course: the lab notebooks, the lecture notes and the course's checker, with the
public test cases only. There are no reference solutions here.

{labs}

## Set up

Python 3.10 or newer, in a fresh virtual environment:

```bash
python -m pip install torch==2.13.0 -e .
```

This installs TVM 0.26.0, PyTorch, Jupyter, matplotlib, Sphinx, and NVIDIA's CUDA compiler pieces
from pip, so every kernel compiles for `sm_90a` and `sm_100a` on any Linux x86-64 machine, with or
without a GPU. On a machine without a GPU you can install the small CPU build of torch first
(`python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`). Conda
users: `conda env create -f environment.yml`.

## Working on a lab

1. Read the lab's lecture notes (`lectures/<lab>/index.md`, or build the site, below), then,
   from this folder, `jupyter lab --notebook-dir=. assignments/lab1_roofline/lab1_roofline.ipynb`
   (Jupyter's file browser then starts here, with `lectures/` in reach).
2. Write your code where a cell says `# YOUR CODE HERE` and replace the `todo("...")` line. Only
   those cells are your submission; keep the function names of the skeleton.
3. Run each part's check cell as you go. It runs the part's public cases on your live code and
   prints its verdict when the part is right (a line, and a line per arch below it for a build
   check); otherwise it stops with what is wrong, said once.
   Parts that need a GPU are skipped on a machine without one; every other part is checked
   here{course_only}.
   The locked graded cells are filled in by the course's autograder; run here, they do nothing.
4. Check the saved notebook on the public cases, in the grader's own processes, with the
   notebook's last cell (`grade_notebook(...)`), or from a terminal (this edition has no hidden
   cases: your grade comes from the course grader, step 5):

   ```bash
   python -m grader check lab1_roofline --public --submission assignments/lab1_roofline/lab1_roofline.ipynb
   python -m grader compile lab1_roofline --submission assignments/lab1_roofline/lab1_roofline.ipynb
   ```

   The second command compiles your kernels for `sm_90a` and `sm_100a` (no GPU needed) and writes
   their CUDA source, PTX, cubin and SASS under `build/kernels/`, for reading.
5. Submit the notebook as your course tells you. Your grade comes from the course grader, which
   also runs hidden cases and times the kernels on a GPU.

## No GPU? Ask the course's GPU queue

If your course runs on a Slurm cluster, you can have the public check of your saved notebook run
on one of the class's GPUs, from the cluster's login node, in this folder:

```bash
python -m grader queue-check {queue_lab} --submission assignments/{queue_lab}/{queue_notebook}
```

It submits one Slurm job on the course's GPU partition (one GPU; your notebook as saved when you
run the command), waits for it (`job 123: queued`, then `running on <node>`), and prints the same
report the check cells print on a GPU, kernels timed included. `--part b_correct` checks one
part; `--no-wait` returns at once and says where the report will be (`squeue --me` shows the
job). Your instructor sets the partition and your limits (checks queued or running at once, and
checks per hour) in `/etc/grader/queue.toml`; past a limit the command says so and when you can
submit again. The queue's settings may also come from a file your instructor hands you:
`--queue-config FILE`, or the variable `GRADER_QUEUE_CONFIG`.

Scores are shown rounded to two decimals.

## Lecture notes

```bash
python -m sphinx -W -b html lectures lectures/_build/html
```
"""

GITIGNORE = """\
__pycache__/
*.pyc
*.egg-info/
.venv/
build/
lectures/_build/
.ipynb_checkpoints/
# Plots the lab notebooks save beside themselves
assignments/**/*.png
"""

STUB = '''\
"""{title}: the student edition's grading (written by `python -m grader release`).

The public cases of the CPU parts are graded from grader/public/{lab}.json; see grader/edition/tables.py."""
from ..edition.tables import sealed_acc_places, sealed_desc_fields, table_graders

GRADERS = table_graders("{lab}")
DESC_FIELDS = sealed_desc_fields("{lab}")      # the build parts' wgmma descriptor tiles, hashed
ACC_PLACES = sealed_acc_places("{lab}")        # the epilogues' accumulator places, hashed per thread
'''


def released_labs(through: str | None) -> list[str]:
    """The labs an edition ships: every lab, or those up to and including ``through`` in the
    course's order (a later lab's given code holds an earlier lab's answers: Lab 5's kernels carry
    Lab 4's epilogue, so a class releasing one lab at a time ships the labs released so far)."""
    labs = spec.lab_names()
    if through is None:
        return labs
    if through not in labs:
        raise ReleaseError(f"--through {through}: no such lab; labs: {', '.join(labs)}")
    return labs[:labs.index(through) + 1]


def _labs_table(labs: list[str]) -> str:
    rows = ["| lab | topic |", "|---|---|"]
    rows += [f"| `{lab}` | {spec.load(lab).title} |" for lab in labs]
    return "\n".join(rows)


def _in_left_out_lab(rel: str, left_out: set[str]) -> bool:
    """``rel`` (a path in the repository) belongs to a lab the edition does not ship: its folder
    under assignments/ or lectures/, its spec, its public table or its grading module."""
    parts = rel.split(os.sep)
    if len(parts) > 2 and parts[0] in ("assignments", "lectures") and parts[1] in left_out:
        return True
    stem = os.path.splitext(parts[-1])[0]
    return len(parts) == 3 and parts[0] == "grader" and parts[1] in ("specs", "labs", "public") and stem in left_out


def _course_only(tables: dict) -> str:
    """The README's word on the parts the edition cannot check (none, as a rule)."""
    parts = [f"`{lab}/{p}`" for lab, t in tables.items() for p in t["course_grader_only"]]
    if not parts:
        return ""
    return (", except " + ", ".join(parts) + ", which say\n   \"checked by the course grader (not in the student"
            " edition)\": their checks need the course's reference code")


def _source_commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _check_dest(dest: str, force: bool) -> None:
    dest_real = os.path.realpath(dest)
    for folder in ("assignments", "lectures", "grader", "solutions", "reports"):
        src = os.path.realpath(os.path.join(REPO_ROOT, folder))
        if dest_real == src or dest_real.startswith(src + os.sep):
            raise ReleaseError(f"{dest} lies inside {folder}/: choose a folder outside the course's sources")
    if dest_real == os.path.realpath(REPO_ROOT):
        raise ReleaseError("the destination is the repository itself")
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise ReleaseError(f"{dest} is a file")
    if os.path.isdir(dest) and os.listdir(dest) and not (force and os.path.exists(os.path.join(dest, MARKER))):
        raise ReleaseError(f"{dest} is not empty (with --force, an earlier student edition is replaced)")


def _prepare(dest: str, force: bool) -> None:
    """An empty ``dest``; an earlier edition's files are removed, its git history (``.git``) kept,
    so that a new release is a new commit the students can pull."""
    _check_dest(dest, force)
    _clear(dest)
    os.makedirs(dest, exist_ok=True)


def _clear(dest: str) -> None:
    """Remove everything in ``dest`` but its git history."""
    for name in os.listdir(dest) if os.path.isdir(dest) else []:
        if name == ".git":
            continue
        path = os.path.join(dest, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


GIT_IDENTITY = ["-c", "user.name=Course release", "-c", "user.email=course-release@localhost",
                "-c", "commit.gpgsign=false"]


def _commit(dest: str, progress) -> str:
    """Make ``dest`` a git repository (or add to its history) with everything the release wrote in
    one commit; returns the commit id, or "" when git is not installed."""
    if shutil.which("git") is None:
        progress("  note: git is not installed, so the edition is a plain folder (not a repository)")
        return ""

    def git(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=dest, capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise ReleaseError(f"git {args[0]} in {dest} failed: {proc.stderr.strip()[-1000:]}")
        return proc

    if not os.path.isdir(os.path.join(dest, ".git")):
        git("init", "-q")
    git("add", "-A")
    if git("status", "--porcelain").stdout.strip():
        git("commit", "-q", "-m", f"Student edition of the course (from {_source_commit()})")
    return git("rev-parse", "HEAD").stdout.strip()


def tracked_files(folder: str, root: str | None = None) -> list[str]:
    """The files of ``folder`` that git tracks, as paths relative to ``root`` (the repository):
    what the edition ships of a folder. Untracked and git-ignored files (a scratch notebook, a
    saved plot, a checkpoint, a cache) are never shipped."""
    root = root or REPO_ROOT
    if shutil.which("git") is None:
        raise ReleaseError("git is not installed: the edition ships the files git tracks, so it needs git")
    proc = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=root, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode:
        raise ReleaseError(f"git ls-files {folder} failed in {root}: {proc.stderr.strip()[-500:]} (the "
                           "student edition is made from the course's git repository)")
    return sorted(p for p in proc.stdout.split("\0") if p and os.path.isfile(os.path.join(root, p)))


def copy_tracked(folder: str, dest: str, root: str | None = None, skip=lambda rel: False,
                 also=lambda rel: False) -> list[str]:
    """Copy the files git tracks in ``folder`` (less those ``skip`` names), and the untracked ones
    that ``also`` names, from ``root`` into ``dest`` (same relative paths); returns them."""
    root = root or REPO_ROOT
    files = {p for p in tracked_files(folder, root) if not skip(p)}
    for dirpath, dirnames, names in os.walk(os.path.join(root, folder)):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if also(rel) and not skip(rel):
                files.add(rel)
    for rel in sorted(files):
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), os.path.join(dest, rel))
    return sorted(files)


def _copy_grader(dest: str, labs: list[str]) -> None:
    left_out = set(spec.lab_names()) - set(labs)
    skip = ({os.path.join("grader", "labs", f"{lab}.py") for lab in spec.lab_names()}
            | {os.path.join("grader", "edition", "release.py")})
    copy_tracked("grader", dest, skip=lambda rel: rel in skip or rel.startswith(os.path.join("grader", "public", ""))
                 or _in_left_out_lab(rel, left_out))
    if left_out:                        # the lock lists the shipped labs' threshold digests only
        lock = os.path.join(dest, "grader", "specs", "thresholds.lock")
        with open(lock) as f:
            digests = json.load(f)
        with open(lock, "w") as f:
            json.dump({lab: v for lab, v in digests.items() if lab in labs}, f, indent=2, sort_keys=True)
            f.write("\n")
    for lab in labs:
        with open(os.path.join(dest, "grader", "labs", f"{lab}.py"), "w") as f:
            f.write(STUB.format(lab=lab, title=spec.load(lab).title))


def _check_shipped(dest: str, tables: dict) -> None:
    """Every module whose function grades a part in the edition (``shipped`` in the tables) is in
    the edition: a module git does not track yet is not copied, and its parts could not be checked."""
    for lab, table in tables.items():
        for part_id, target in table["shipped"].items():
            rel = target.partition(":")[0].replace(".", os.sep)
            if not (os.path.isfile(os.path.join(dest, rel + ".py"))
                    or os.path.isfile(os.path.join(dest, rel, "__init__.py"))):
                _clear(dest)
                raise ReleaseError(f"{lab}/{part_id} is graded by {target}, but {rel}.py is not in the edition "
                                   "(the edition ships the files git tracks: add it to the repository)")


def _generated(rel: str) -> bool:
    """A figure a lecture's ``figures.py`` draws (``lectures/<lab>/generated/``; git-ignored)."""
    folders = rel.split(os.sep)[:-1]
    return "generated" in folders and "_build" not in folders and not rel.endswith((".pyc", ".pyo"))


def _copy_lectures(dest: str, progress, left_out: set[str]) -> None:
    """The lecture notes of the shipped labs with their figures drawn (the files git tracks, and
    the figures the scripts drew). A figure script that draws from the grader's references
    (``grader.labs.<lab>``) is left out and its figures are shipped drawn. The table of contents
    lists the shipped labs' notes only."""
    scripts = sorted(p for p in os.listdir(os.path.join(REPO_ROOT, "lectures"))
                     if os.path.isfile(os.path.join(REPO_ROOT, "lectures", p, "figures.py")) and p not in left_out)
    for lab in scripts:
        folder = os.path.join(REPO_ROOT, "lectures", lab)
        proc = subprocess.run([sys.executable, "figures.py"], cwd=folder, capture_output=True, text=True)
        if proc.returncode:
            raise ReleaseError(f"lectures/{lab}/figures.py failed: {proc.stderr[-2000:]}")
    copy_tracked("lectures", dest, also=_generated, skip=lambda rel: _in_left_out_lab(rel, left_out))
    if left_out:
        index = os.path.join(dest, "lectures", "index.md")
        with open(index) as f:
            lines = f.read().splitlines(keepends=True)
        with open(index, "w") as f:
            f.writelines(ln for ln in lines if ln.strip() not in {f"{lab}/index" for lab in left_out})
    for lab in scripts:
        script = os.path.join(dest, "lectures", lab, "figures.py")
        with open(script) as f:
            if re.search(r"^\s*(from|import)\s+grader\.labs\b", f.read(), re.M):
                os.remove(script)
                progress(f"  lectures/{lab}: figures shipped drawn (its script draws from the references)")


def _patch(dest: str, progress) -> None:
    for rel, old, new, why, required in PATCHES:
        path = os.path.join(dest, rel)
        with open(path) as f:
            text = f.read()
        if old not in text:
            if not required:
                progress(f"  note: {rel} changed, so the edition goes without: {why} (PATCHES in grader/edition/release.py)")
                continue
            raise ReleaseError(f"{rel} changed: the edition needs {why}; update PATCHES in grader/edition/release.py")
        with open(path, "w") as f:
            f.write(text.replace(old, new))


def build_release(dest: str, force: bool = False, progress=print, through: str | None = None) -> dict:
    """Write the student edition to ``dest`` (every lab, or the labs up to ``through``); returns
    the tables recorded. Raises ReleaseError."""
    if not os.path.isdir(SOLUTIONS):
        raise ReleaseError(f"no {SOLUTIONS}: the student edition is made from the full repository")
    dest = os.path.abspath(dest)
    _check_dest(dest, force)
    labs = released_labs(through)
    left_out = set(spec.lab_names()) - set(labs)
    if left_out:
        progress(f"shipping {', '.join(labs)}; left out until released: {', '.join(sorted(left_out))}")
    tables = {}
    for lab in labs:
        progress(f"recording the public cases of {lab} ...")
        tables[lab] = record_lab(lab, progress)
        self_check(lab, tables[lab], progress)
        t = tables[lab]
        progress(f"  from tables: {', '.join(t['parts']) or '-'}; by shipped code: "
                 f"{', '.join(list(t['shipped']) + t['default_runner']) or '-'}; "
                 f"course grader only: {', '.join(t['course_grader_only']) or '-'}")
    _prepare(dest, force)
    copy_tracked("assignments", dest,        # the notebooks as committed: no scratch file, no plot
                 skip=lambda rel: _in_left_out_lab(rel, left_out))
    _copy_lectures(dest, progress, left_out)
    _copy_grader(dest, labs)
    _check_shipped(dest, tables)
    os.makedirs(os.path.join(dest, "grader", "public"), exist_ok=True)
    for lab, table in tables.items():
        with open(os.path.join(dest, "grader", "public", f"{lab}.json"), "w") as f:
            json.dump(table, f, separators=(",", ":"))
            f.write("\n")
    for f in ("pyproject.toml", "environment.yml"):
        shutil.copy2(os.path.join(REPO_ROOT, f), os.path.join(dest, f))
    _patch(dest, progress)
    with open(os.path.join(dest, "README.md"), "w") as f:
        queue_lab = labs[min(1, len(labs) - 1)]      # the README's example: Lab 2, or Lab 1 alone
        f.write(STUDENT_README.format(labs=_labs_table(labs), course_only=_course_only(tables), queue_lab=queue_lab,
                                      queue_notebook=spec.load(queue_lab).notebook))
    with open(os.path.join(dest, ".gitignore"), "w") as f:
        f.write(GITIGNORE)
    with open(os.path.join(dest, MARKER), "w") as f:
        f.write(f"student edition of the course, made by `python -m grader release` from {_source_commit()}\n")
    found = leaks(dest)
    if found:
        _clear(dest)
        raise ReleaseError("the edition would leak solutions, so it was removed:\n  " + "\n  ".join(found[:20]))
    commit = _commit(dest, progress)
    progress(f"wrote the student edition to {dest}" + (f" (a git repository, commit {commit[:12]})" if commit else ""))
    return tables
