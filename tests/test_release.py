"""The student edition (``python -m grader release DIR``): it holds no solution, and its grader
runs the public checks on its own, in a fresh Python process that imports only the edition."""
import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from grader import spec
from grader.edition import release

LABS = spec.lab_names()
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edition(root, tmp_path_factory):
    dest = tmp_path_factory.mktemp("edition") / "course"
    proc = subprocess.run([sys.executable, "-m", "grader", "release", str(dest)], cwd=root,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return str(dest)


def _text_files(top):
    for dirpath, dirnames, files in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".git")]
        for f in files:
            path = os.path.join(dirpath, f)
            try:
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, top), fh.read()
            except UnicodeDecodeError:
                continue   # the lecture figures (PNG)


def _cells(path):
    with open(path) as f:
        nb = json.load(f)
    return nb, [c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in nb["cells"]]


def _secret_lines(root):
    """Every line between BEGIN/END SOLUTION and BEGIN/END HIDDEN TESTS of every solutions
    notebook, longer than a trivial token (over 12 characters, not a comment, not a trivial
    call), less the lines found in the given code of the lab's own notebook (a builder repeating
    a line of a given macro) or in another lab's student notebook or lecture (lab 4's skeleton
    allocates shared memory the way lab 2's solution does), as part of a line or a whole one."""
    given = {}
    for lab in LABS:
        texts = _cells(os.path.join(root, "assignments", lab, spec.load(lab).notebook))[1]
        lecture = os.path.join(root, "lectures", lab, "index.md")
        if os.path.isfile(lecture):
            with open(lecture) as f:
                texts.append(f.read())
        given[lab] = "\n".join(ln.strip() for src in texts for ln in src.splitlines())
    secret = {}
    for lab in LABS:
        inside_lines, own = release.regions(os.path.join(root, "solutions", lab, spec.load(lab).notebook))
        own_text = "\n".join(own)
        for s in inside_lines:
            if (len(s) > 12 and not s.startswith("#") and not release.trivial(s)
                    and s not in own_text and not any(s in given[other] for other in LABS if other != lab)):
                secret.setdefault(s, lab)
    return secret


def test_edition_has_what_students_need(edition):
    for path in ["README.md", "pyproject.toml", "environment.yml", "lectures/conf.py", "lectures/index.md",
                 "grader/__main__.py", "grader/notebook.py", "grader/edition/tables.py"]:
        assert os.path.isfile(os.path.join(edition, path)), path
    for lab in LABS:
        assert os.path.isfile(os.path.join(edition, "assignments", lab, spec.load(lab).notebook))
        assert os.path.isfile(os.path.join(edition, "lectures", lab, "index.md"))
        assert os.path.isfile(os.path.join(edition, "grader", "public", f"{lab}.json"))
        with open(os.path.join(edition, "grader", "labs", f"{lab}.py")) as f:
            assert f'GRADERS = table_graders("{lab}")' in f.read()
    with open(os.path.join(edition, "README.md")) as f:
        readme = f.read()
    assert "--public" in readme and "python -m grader compile" in readme


def test_no_solutions_no_references(root, edition):
    for folder in ("solutions", "reports", "source", "release"):
        assert not os.path.exists(os.path.join(edition, folder)), folder
    # No function of any grader/labs/<lab>.py (references, hidden-case generators, checks that
    # use them) is defined anywhere in the edition, unless a shipped module of the full
    # repository defines a function of that name too.
    lab_functions, shipped_functions = set(), set()
    for dirpath, _, files in os.walk(os.path.join(root, "grader")):
        for f in files:
            if not f.endswith(".py") or "__pycache__" in dirpath:
                continue
            path = os.path.join(dirpath, f)
            with open(path) as fh:
                names = {n.name for n in ast.walk(ast.parse(fh.read())) if isinstance(n, ast.FunctionDef)}
            is_lab = os.path.basename(dirpath) == "labs" and f[:-3] in LABS
            (lab_functions if is_lab else shipped_functions).update(names)
    private = lab_functions - shipped_functions
    assert any(n.startswith("ref_") for n in private)
    for rel, text in _text_files(edition):
        assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, rel
        if rel.endswith(".py"):
            defined = {n.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}
            assert not defined & private, f"{rel} defines {sorted(defined & private)[:5]}"
            assert not re.search(r"\bref_\w+", text), f"{rel} names a reference function"
    assert not os.path.exists(os.path.join(edition, "grader", "edition", "release.py"))   # the instructors' side
    assert not any("def build_release" in text for _, text in _text_files(edition))


def test_no_solution_text_anywhere(root, edition):
    secret = _secret_lines(root)
    assert len(secret) > 100
    leaked = [(rel, s) for rel, text in _text_files(edition) for s in secret if s in text]
    assert not leaked, f"solution lines in the edition: {leaked[:5]}"


def test_tables_hold_no_reference_design(edition):
    """Lab 3's address patterns are graded on several tile layouts; the one that answers
    transpose_smem_offset must not be among the edition's tables."""
    from grader.labs import lab3_layout_swizzle as L
    answer = [int(L.ref_transpose_offset(i, j)) for i in range(L.TILE_ROWS) for j in range(L.TILE_COLS)]
    with open(os.path.join(edition, "grader", "public", "lab3_layout_swizzle.json")) as f:
        table = json.load(f)
    offsets = [(part, name, o["values"]) for part, e in table["parts"].items()
               for name, o in e.get("offsets", {}).items()]
    assert offsets
    assert not [(part, name) for part, name, values in offsets if values == answer]


def _paste_reference(root, edition, lab, dest):
    """The edition's student notebook with the reference answer cells pasted in."""
    nb_name = spec.load(lab).notebook
    ref_nb, _ = _cells(os.path.join(root, "solutions", lab, nb_name))
    answers = {}
    for c in ref_nb["cells"]:
        meta = c["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            answers[meta["grade_id"]] = "\n".join(ln for ln in src.splitlines() if "### BEGIN SOLUTION" not in ln
                                                  and "### END SOLUTION" not in ln)
    nb, _ = _cells(os.path.join(edition, "assignments", lab, nb_name))
    for c in nb["cells"]:
        meta = c["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            c["source"] = answers[meta["grade_id"]]
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, nb_name)
    with open(path, "w") as f:
        json.dump(nb, f)
    return path


# Run in the edition, in a fresh process: execute a notebook's module cells (as "run all" does
# up to the checks), then call the public check of each part given; print one JSON line.
CHECK_SCRIPT = textwrap.dedent("""
    import json, sys, types
    edition, notebook, lab, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    import grader
    assert grader.__file__.startswith(edition), grader.__file__
    from grader.notebook import CheckFailed, check, last_result
    with open(notebook) as f:
        nb = json.load(f)
    import linecache
    ns = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"]):
        meta = cell["metadata"]
        nbg = meta.get("nbgrader", {})
        given = "module" in meta.get("tags", [])
        if cell["cell_type"] == "code" and (given or (nbg.get("solution") and not nbg.get("grade"))):
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            name = f"<cell {i}>"          # kept in linecache, as Jupyter keeps its cells (TIRx reads them)
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
            exec(compile(src, name, "exec"), ns)
    out = {}
    for part in parts:
        try:
            check(lab, part, ns)
            res = last_result(lab, part)
            out[part] = [res.verdict, res.message]
        except CheckFailed as e:
            out[part] = ["raised " + type(e).__name__, e.result.message]
        except BaseException as e:
            out[part] = ["raised " + type(e).__name__, str(e)]
    print("RESULT " + json.dumps(out))
""")


def _check_in_edition(edition, notebook, lab, parts):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SECRET_SEED")}
    env["PYTHONPATH"] = edition
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, edition, notebook, lab, ",".join(parts)],
                          cwd=edition, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _edited(notebook, old, new, dest):
    """A copy of ``notebook`` at ``dest`` with ``old`` replaced by ``new`` in every cell."""
    with open(notebook) as f:
        nb = json.load(f)
    for c in nb["cells"]:
        src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        c["source"] = src.replace(old, new)
    with open(dest, "w") as f:
        json.dump(nb, f)
    return dest


def test_public_checks_in_a_fresh_process(root, edition, tmp_path):
    lab = "lab1_roofline"
    cpu = ["a_flops", "a_bytes", "a_predict", "c_roofline"]
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    good = _check_in_edition(edition, pasted, lab, cpu + ["b_build"])
    for part in cpu:
        assert good[part][0] == "passed", (part, good[part])
        assert "public cases" in good[part][1]
    assert good["b_build"][0] == "passed" and "sm_100a: compiled" in good["b_build"][1], good["b_build"]
    student = os.path.join(edition, "assignments", lab, spec.load(lab).notebook)
    bad = _check_in_edition(edition, student, lab, cpu)
    for part in cpu:
        assert bad[part][0].startswith("raised"), (part, bad[part])
        assert "not implemented" in bad[part][1], (part, bad[part])


def test_public_checks_of_the_hand_recorded_parts(root, edition, tmp_path):
    """Lab 3's layout parts are recorded by hand (their grading functions do more than tables)."""
    lab = "lab3_layout_swizzle"
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    table = json.load(open(os.path.join(edition, "grader", "public", f"{lab}.json")))
    parts = [p for p in ("a_layouts", "b_patterns") if p in table["parts"]]
    assert parts, "lab 3's hand-recorded parts were dropped from the edition (see the release's warnings)"
    good = _check_in_edition(edition, pasted, lab, parts)
    assert all(good[p][0] == "passed" for p in parts), good
    # The edition has no wavefront model of its own (it is part b_counter's answer): it counts the
    # transpose layout's conflicts with the student's own functions, says so, and scores nothing by it.
    assert ("addresses_rows up to 4 wavefronts (the design needs 4), addresses_gather up to 1 wavefronts "
            "(the design needs 1)") in good["b_patterns"][1], good["b_patterns"]
    plain = _edited(pasted, "row = (r % 8) * 8 + r // 8", "row = r", str(tmp_path / "plain_swizzle.ipynb"))
    bad = _check_in_edition(edition, plain, lab, ["b_patterns"])["b_patterns"]
    assert "addresses_gather up to 8 wavefronts (the design needs 1)" in bad[1], bad
    assert "not scored here" in bad[1] and bad[0] == "passed", bad       # the course grader scores it


def test_cli_public_check_in_the_edition(root, edition, tmp_path):
    lab = "lab2_tma"
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SECRET_SEED")}
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "grader", "check", lab, "--public", "--submission", pasted,
                           "--part", "a_box", "--part", "a_map", "--json", str(out)],
                          cwd=edition, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r["part"]: r for r in json.loads(out.read_text())["results"]}
    assert results["a_box"]["verdict"] == "passed" and results["a_map"]["verdict"] == "passed", results


def test_cli_compile_in_the_edition(root, edition, tmp_path):
    lab = "lab1_roofline"
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SECRET_SEED")}
    out = tmp_path / "kernels"
    proc = subprocess.run([sys.executable, "-m", "grader", "compile", lab, "--submission", pasted, "--out", str(out)],
                          cwd=edition, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for arch in spec.load(lab).part("b_build").params["archs"]:
        assert (out / f"build_scale_add.{arch}.ptx").stat().st_size > 0
        assert (out / f"build_scale_add.{arch}.sass").stat().st_size > 0


def test_edition_is_a_git_repository_with_everything_committed(edition):
    log = subprocess.run(["git", "log", "--format=%s"], cwd=edition, capture_output=True, text=True)
    assert log.returncode == 0 and log.stdout.startswith("Student edition of the course"), log.stdout + log.stderr
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=edition,
                            capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout == "", status.stdout
    tracked = subprocess.run(["git", "ls-files"], cwd=edition, capture_output=True, text=True).stdout.split()
    assert "grader/notebook.py" in tracked and "grader/public/lab1_roofline.json" in tracked


def test_the_editions_last_cell_grades_the_public_cases(edition):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SECRET_SEED")}
    proc = subprocess.run([sys.executable, "-c", "from grader import notebook; print(notebook.STUDENT_EDITION)"],
                          cwd=edition, env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stdout + proc.stderr
    from grader import notebook
    assert notebook.STUDENT_EDITION is False         # the full repository grades hidden cases too


def test_check_and_compile_agree_on_the_parts_they_check(edition):
    """`compile` compiles every build part's kernels; the edition's check cells and `check --public`
    grade those same parts (none is left to the course grader)."""
    for lab in LABS:
        with open(os.path.join(edition, "grader", "public", f"{lab}.json")) as f:
            table = json.load(f)
        builds = {p.id for p in spec.load(lab).parts if p.kind == "build"}
        checked = set(table["parts"]) | set(table["shipped"]) | set(table["default_runner"])
        assert builds <= checked, (lab, sorted(builds - checked))
        assert not builds & set(table["course_grader_only"]), lab


def test_release_refuses_a_folder_in_use(root, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "grader", "release", str(tmp_path)], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "not empty" in proc.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_edition_ships_only_what_git_tracks(root, edition):
    """assignments/ in the edition is exactly the files git tracks there; its .gitignore keeps the
    notebooks' plots and a virtual environment out of the students' commits."""
    tracked = set(release.tracked_files("assignments", root))
    shipped = set()
    for dirpath, dirnames, files in os.walk(os.path.join(edition, "assignments")):
        shipped |= {os.path.relpath(os.path.join(dirpath, f), edition) for f in files}
    assert shipped == tracked
    with open(os.path.join(edition, ".gitignore")) as f:
        ignored = f.read().split()
    assert {".venv/", "assignments/**/*.png"} <= set(ignored), ignored


def test_untracked_and_ignored_files_are_not_shipped(tmp_path):
    """A temporary course repository: a tracked notebook is copied; a scratch notebook nobody added,
    a git-ignored plot and a checkpoint are not; a lecture's drawn figure (git-ignored) is when asked."""
    repo, dest = tmp_path / "repo", tmp_path / "edition"
    lab = repo / "assignments" / "lab1"
    (lab / ".ipynb_checkpoints").mkdir(parents=True)
    (lab / "lab1.ipynb").write_text("{}")
    (lab / "scratch.ipynb").write_text("{}")                       # untracked
    (lab / "plot.png").write_bytes(b"png")                          # ignored
    (lab / ".ipynb_checkpoints" / "lab1-checkpoint.ipynb").write_text("{}")
    (repo / "lectures" / "lab1" / "generated").mkdir(parents=True)
    (repo / "lectures" / "lab1" / "index.md").write_text("# Lab 1")
    (repo / "lectures" / "lab1" / "generated" / "fig.png").write_bytes(b"png")
    (repo / "lectures" / "lab1" / "notes.txt").write_text("mine")  # untracked
    (repo / ".gitignore").write_text("*.png\n.ipynb_checkpoints/\n")
    for args in (["init", "-q"], ["add", ".gitignore", "assignments/lab1/lab1.ipynb", "lectures/lab1/index.md"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    assert release.copy_tracked("assignments", str(dest), root=str(repo)) == ["assignments/lab1/lab1.ipynb"]
    shipped = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    assert shipped == ["assignments/lab1/lab1.ipynb"]
    assert release.copy_tracked("lectures", str(dest), root=str(repo), also=release._generated) == [
        "lectures/lab1/generated/fig.png", "lectures/lab1/index.md"]


def test_sealed_public_answers_are_hashes_that_still_tell_right_from_wrong():
    """Lab 4's descriptor fields have few inputs; the edition's table held the answers the Hopper
    kernels need (wgmma_desc_fields(128), an MN-major case). Sealed, the table keeps a salted hash
    per case: the reference passes, a list or an array passes as a tuple would, a wrong answer
    fails with what it returned, and no plain answer of a sealed function is left in the table."""
    import types

    import numpy as np

    from grader.edition import tables
    from grader.labs import lab4_gemm as L
    entry = release.record_lab("lab4_gemm", progress=lambda *a: None)["parts"]["a_desc"]
    checks = {c["fn"]: c for c in entry["checks"]}
    assert spec.load("lab4_gemm").part("a_desc").params["sealed_public"] == ["wgmma_desc_fields", "wgmma_desc_fields_mn"]
    for fn in ("wgmma_desc_fields", "wgmma_desc_fields_mn"):
        assert checks[fn]["compare"] == {"kind": "sealed"}
        text = json.dumps(checks[fn]["cases"])
        assert "__tuple__" not in text and "__sealed__" in text, text
    assert "[1, 64, 3]" not in json.dumps(entry) and "[256, 64, 3]" not in json.dumps(entry)
    assert checks["wgmma_desc_offset"]["compare"] == {"kind": "same"}       # not sealed: answers shown
    ref = types.SimpleNamespace(wgmma_desc_fields=L.ref_desc_fields, wgmma_desc_fields_mn=L.ref_desc_fields_mn,
                                wgmma_desc_offset=L.ref_desc_offset)
    as_lists = types.SimpleNamespace(wgmma_desc_fields=lambda sw: list(L.ref_desc_fields(sw)),
                                     wgmma_desc_fields_mn=lambda sw, k: np.array(L.ref_desc_fields_mn(sw, k)),
                                     wgmma_desc_offset=L.ref_desc_offset)
    wrong = types.SimpleNamespace(wgmma_desc_fields=lambda sw: (1, 64, 3), wgmma_desc_fields_mn=lambda sw, k: None,
                                  wgmma_desc_offset=L.ref_desc_offset)
    assert tables.grade_from_table(entry, ref, None).fraction == 1.0
    assert tables.grade_from_table(entry, as_lists, None).fraction == 1.0
    out = tables.grade_from_table(entry, wrong, None)
    assert out.fraction == 0.6, out.message          # 1 + 5 of 10: (1, 64, 3) is right for 128 only
    assert "got [1, 64, 3]; this public case's answer is sealed" in out.message, out.message


def test_the_descriptor_tiles_of_lab4s_build_parts_are_sealed_in_the_table():
    """The build parts' wgmma descriptor check needs the tiles' fields; the edition's table holds
    them hashed, and the edition's grader finds them there (no lab module in the edition)."""
    table = release.record_lab("lab4_gemm", progress=lambda *a: None)
    assert set(table["desc_fields"]) == {f"s{s}_build_sm90" for s in (1, 2, 3, 4)}
    text = json.dumps(table["desc_fields"])
    assert "512" not in text and "[1, 64, 3]" not in text and "__sealed__" in text
    for part in spec.load("lab4_gemm").parts:
        if part.id in table["desc_fields"]:
            assert "wgmma_desc_fields" in part.mechanisms, part.id


def test_the_editions_build_check_reads_the_sealed_accumulator_places(root, edition, tmp_path):
    """In the edition, Lab 4's Hopper build parts check where the epilogue stores each accumulator
    register against the places hashed in its table: the reference passes, a transposed epilogue
    fails, on a machine without a GPU; the table does not hold the places."""
    lab = "lab4_gemm"
    table = release.record_lab(lab, progress=lambda *a: None)
    assert set(table["acc_places"]) == {f"s{s}_build_sm90" for s in (1, 2, 3, 4)}
    for entries in table["acc_places"].values():    # hashes and salts only: no offset in the table
        for entry in entries:
            assert set(entry) == {"cols", "regs", "block", "via", "size", "seals"} and len(entry["seals"]) == 128
            assert all(set(seal) == {"__sealed__", "salt"} for seal in entry["seals"])
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    checked = _check_in_edition(edition, pasted, lab, ["s1_build_sm90", "s3_build_sm90", "s4_build_sm90"])
    for part in ("s1_build_sm90", "s4_build_sm90"):       # into D, and into the tile the TMA store reads
        good = checked[part]
        assert good[0] == "passed" and "each of 128 threads stores its 128 registers" in good[1], (part, good)
    edge = checked["s3_build_sm90"]                       # CTA (1, 2) of 200 x 328 is an edge tile
    assert edge[0] == "passed" and "registers of elements outside D (an edge tile) nowhere" in edge[1], edge
    bad_path = _edited(pasted, "D.vstore([WGMMA_M * h + row, col], pair", "D.vstore([col, WGMMA_M * h + row], pair",
                       str(tmp_path / "bad.ipynb"))
    bad = _check_in_edition(edition, bad_path, lab, ["s1_build_sm90"])["s1_build_sm90"]
    assert bad[0] != "passed" and "threads store registers where the wgmma accumulator does not hold them" in bad[1], bad
    unbounded = _edited(pasted, "if m_st + WGMMA_M * h + row < M and n_st + col < N:", "if True:",
                        str(tmp_path / "unbounded.ipynb"))
    past = _check_in_edition(edition, unbounded, lab, ["s3_build_sm90"])["s3_build_sm90"]
    assert past[0] != "passed" and "store registers outside D (200 rows of 328)" in past[1], past


def test_the_editions_lab5_build_check_follows_the_consumers_epilogue_through_its_tma_stores(root, edition, tmp_path):
    """Lab 5's sealed places name the consumer warpgroup's first thread (steps 7-9: thread 128) and
    hold the fragment's shape hashed per wgmma width, any tile being the kernel's: in the edition,
    the reference's steps 5, 7 and 8 pass on a machine without a GPU, and a step 7 without the
    barrier before its store fails."""
    lab = "lab5_gemm_pipeline"
    table = release.record_lab(lab, progress=lambda *a: None)
    assert {p: [e["first"] for e in entries] for p, entries in table["acc_places"].items()} == {
        "s5_build_sm90": [0, 0], "s6_build_sm90": [0], "s7_build_sm90": [128], "s8_build_sm90": [128],
        "s9_build_sm90": [128]}
    for entry in (e for entries in table["acc_places"].values() for e in entries):   # hashes and salts only
        assert entry["kind"] == "relative" and entry["tile"][:2] == [None, None]       # any tile: the kernel's choice
        assert set(entry) == {"kind", "cols", "tile", "block", "via", "first", "threads", "group", "out", "seals"}
        assert all(set(seal) == {"__sealed__", "salt"} for seals in entry["seals"].values() for seal in seals)
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    for part, (verdict, message) in _check_in_edition(edition, pasted, lab, ["s5_build_sm90", "s7_build_sm90",
                                                                              "s8_build_sm90"]).items():
        assert verdict == "passed" and "tile once" in message, (part, message)
    racing = _edited(pasted, 'T.ptx.fence.proxy_async("shared::cta")\n                T.cuda.warpgroup_sync(CONSUMER_BAR)',
                     'T.ptx.fence.proxy_async("shared::cta")', str(tmp_path / "racing.ipynb"))
    bad = _check_in_edition(edition, racing, lab, ["s7_build_sm90"])["s7_build_sm90"]
    assert bad[0] != "passed" and "written while a TMA store may still be reading the tile" in bad[1], bad


def test_the_editions_lab6_build_check_follows_o_on_a_cpu(root, edition, tmp_path):
    """Lab 6's sealed places follow O (steps 2-4; not step 5, whose packed heads make its block of O
    no rectangle): in the edition, the reference's step 3 passes on a machine without a GPU."""
    lab = "lab6_flash_attention"
    table = release.record_lab(lab, progress=lambda *a: None)
    assert {p: {e["out"] for e in entries} for p, entries in table["acc_places"].items()} == {
        "s2_build_sm90": {"O"}, "s3_build_sm90": {"O"}, "s4_build_sm90": {"O"}}
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    verdict, message = _check_in_edition(edition, pasted, lab, ["s3_build_sm90"])["s3_build_sm90"]
    assert verdict == "passed" and "cover the 128 x 128 tile once" in message, message


def test_the_editions_build_check_reads_the_sealed_descriptor_tiles(root, edition, tmp_path):
    """In the edition, Lab 4's Hopper build part checks the descriptors against the sealed tiles:
    the reference passes, a B descriptor with half its LBO fails, on a machine without a GPU."""
    lab = "lab4_gemm"
    pasted = _paste_reference(root, edition, lab, str(tmp_path / "pasted"))
    good = _check_in_edition(edition, pasted, lab, ["s1_build_sm90"])["s1_build_sm90"]
    assert good[0] == "passed" and "ok (each of A (K-major), B (N-major)" in good[1], good
    line = "LBO_B, SBO_B, _ = wgmma_desc_fields_mn(128, BLK_K)"
    bad_path = _edited(pasted, line, line.replace("BLK_K)", "BLK_K // 2)"), str(tmp_path / "bad.ipynb"))
    bad = _check_in_edition(edition, bad_path, lab, ["s1_build_sm90"])["s1_build_sm90"]
    assert bad[0] != "passed" and "no descriptor has the fields of B (N-major)" in bad[1], bad


def test_an_edition_through_a_lab_ships_the_labs_released_so_far(root, tmp_path):
    """``release --through lab1_roofline``: a class releasing one lab at a time. Lab 1 alone is in
    the edition (notebook, lecture in the table of contents, spec, public table, threshold digest);
    no later lab's notebook, lecture or check is (Lab 5's given code holds Lab 4's epilogue); the
    lecture site builds; a check of a later lab says there is no such lab; an unknown lab is refused."""
    dest = tmp_path / "course"
    proc = subprocess.run([sys.executable, "-m", "grader", "release", "--through", "lab1_roofline", str(dest)],
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    later = LABS[1:]
    assert "left out until released: " + ", ".join(later) in proc.stdout
    assert os.listdir(dest / "assignments") == ["lab1_roofline"]
    assert sorted(p.name for p in (dest / "lectures").iterdir() if p.is_dir()) == ["lab1_roofline"]
    assert sorted(os.listdir(dest / "grader" / "specs")) == ["lab1_roofline.toml", "thresholds.lock"]
    assert sorted(os.listdir(dest / "grader" / "public")) == ["lab1_roofline.json"]
    assert list(json.loads((dest / "grader" / "specs" / "thresholds.lock").read_text())) == ["lab1_roofline"]
    for rel, text in _text_files(str(dest)):
        for lab in later:
            assert f"{lab}/index" not in text and f"{lab}.ipynb" not in text, (rel, lab)
    readme = (dest / "README.md").read_text()
    assert "| `lab1_roofline` |" in readme and "| `lab4_gemm` |" not in readme
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SECRET_SEED")}
    site = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "lectures",
                           str(tmp_path / "html")], cwd=dest, env=env, capture_output=True, text=True, timeout=600)
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    check = subprocess.run([sys.executable, "-m", "grader", "check", "lab4_gemm", "--public"], cwd=dest, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode != 0 and "no lab 'lab4_gemm'; labs: lab1_roofline" in check.stderr, check.stderr
    refused = subprocess.run([sys.executable, "-m", "grader", "release", "--through", "lab7", str(tmp_path / "x")],
                             cwd=root, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "--through lab7: no such lab" in refused.stderr, refused.stderr


SEALED_DESIGN_PARTS = {"lab5_gemm_pipeline": ("a_ring", "b_regs", "c_sched", "d_cluster"),
                       "lab6_flash_attention": ("b_causal", "c_gqa", "d_budget")}


@pytest.mark.parametrize("lab", sorted(SEALED_DESIGN_PARTS))
def test_the_design_rules_of_labs_5_and_6_are_sealed_in_the_table(lab):
    """A trial student read Lab 5's rules (the empty barrier's arrivals, the setmaxnreg rounding)
    off the public answers of parts a-d; those parts' functions are now sealed: every public
    answer is a salted hash, the reference passes, a function that returns something else fails
    with what it returned. Lab 6's online softmax (floating point, compared within tolerances)
    stays open."""
    import types

    from grader.edition import tables
    recorded = release.record_lab(lab, progress=lambda *a: None)["parts"]
    import importlib
    module = importlib.import_module(f"grader.labs.{lab}")
    for part in SEALED_DESIGN_PARTS[lab]:
        entry = recorded[part]
        fns = spec.load(lab).part(part).params["functions"]
        assert spec.load(lab).part(part).params["sealed_public"] == fns, part
        for chk in entry["checks"]:
            assert chk["compare"] == {"kind": "sealed"}, (part, chk["fn"])
            assert "__tuple__" not in json.dumps(chk["cases"]) and "__sealed__" in json.dumps(chk["cases"]), part
        ref = types.SimpleNamespace(**{fn: getattr(module, f"ref_{fn}") for fn in fns})
        assert tables.grade_from_table(entry, ref, None).fraction == 1.0, part
        off = types.SimpleNamespace(**{fn: (lambda *a, **k: "not the answer") for fn in fns})
        out = tables.grade_from_table(entry, off, None)
        assert out.fraction == 0.0 and "got 'not the answer'; this public case's answer is sealed" in out.message, out.message
    if lab == "lab6_flash_attention":
        assert all(c["compare"]["kind"] == "allclose" for c in recorded["a_softmax"]["checks"])
