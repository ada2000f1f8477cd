"""Each solution notebook agrees with its lab's spec: one graded cell ``test_<part>`` per part,
worth the part's points, and every check or grade call names a part that exists."""
import json
import os
import re
import shutil
import subprocess

import pytest

from grader import spec

LABS = spec.lab_names()
CALL = re.compile(r"""\b(check|grade)\(\s*["']([^"']+)["']\s*,\s*["']([^"']+)["']""")


def _notebook(root, lab):
    with open(os.path.join(root, "solutions", lab, spec.load(lab).notebook)) as f:
        return json.load(f)


def _source(cell):
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def _graded(nb):
    """grade_id -> (points, source) of every nbgrader graded cell."""
    out = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            assert meta["grade_id"] not in out, f"two graded cells named {meta['grade_id']}"
            out[meta["grade_id"]] = (meta.get("points"), _source(cell))
    return out


@pytest.mark.parametrize("lab", LABS)
def test_graded_cells_match_the_spec(root, lab):
    lab_spec = spec.load(lab)
    graded = _graded(_notebook(root, lab))
    assert all(g.startswith("test_") for g in graded), f"graded cells not named test_<part>: {sorted(graded)}"
    cells = {g[len("test_"):]: pts for g, (pts, _) in graded.items()}
    parts = {p.id: p.points for p in lab_spec.parts}
    assert set(cells) == set(parts), (f"parts without a graded cell: {sorted(set(parts) - set(cells))}; "
                                      f"graded cells without a part: {sorted(set(cells) - set(parts))}")
    wrong = {p: (cells[p], parts[p]) for p in parts if cells[p] is None or float(cells[p]) != parts[p]}
    assert not wrong, f"points differ (notebook, spec): {wrong}"


@pytest.mark.parametrize("lab", LABS)
def test_graded_cells_say_their_points_in_words_that_agree(root, lab):
    """Each graded cell's comment names its part and its points as the spec has them ("1 point",
    "2 points"), in the solution and in the student's version."""
    parts = {p.id: p.points for p in spec.load(lab).parts}
    for version in ("solutions", "assignments"):
        with open(os.path.join(root, version, lab, spec.load(lab).notebook)) as f:
            graded = _graded(json.load(f))
        for grade_id, (_, src) in graded.items():
            part = grade_id[len("test_"):]
            pts = parts[part]
            words = f"{pts:g} point" + ("" if pts == 1 else "s")
            assert f"Graded cell for part {part} ({words}):" in src, (version, grade_id, src[:120])


@pytest.mark.parametrize("lab", LABS)
def test_graded_cells_grade_their_own_part(root, lab):
    for grade_id, (_, src) in _graded(_notebook(root, lab)).items():
        calls = [(fn, a, b) for fn, a, b in CALL.findall(src) if fn == "grade"]
        assert calls == [("grade", lab, grade_id[len("test_"):])], f"{grade_id}: {src!r}"


@pytest.mark.parametrize("lab", LABS)
def test_check_cells_name_real_parts(root, lab):
    ids = {p.id for p in spec.load(lab).parts}
    checked = set()
    for cell in _notebook(root, lab)["cells"]:
        if cell["cell_type"] != "code":
            continue
        for fn, named_lab, part in CALL.findall(_source(cell)):
            assert named_lab == lab, f"{fn}({named_lab!r}, {part!r}) in {lab}'s notebook"
            assert part in ids, f"{fn}({lab!r}, {part!r}): {lab} has no part {part!r}"
            if fn == "check":
                checked.add(part)
    assert checked, f"{lab}'s notebook has no check cells"


@pytest.mark.parametrize("lab", LABS)
def test_the_last_cell_grades_the_saved_notebook(root, lab):
    code = [_source(c) for c in _notebook(root, lab)["cells"] if c["cell_type"] == "code"]
    assert re.match(rf"""grade_notebook\(["']{lab}["']\)""", code[-1]), code[-1]
    assert any(re.search(r"from grader\.notebook import .*\bgrade_notebook\b", src) for src in code[:3])


@pytest.mark.parametrize("lab", LABS)
def test_kernels_are_timed_the_graders_way(root, lab):
    """A cell that times kernels uses grader.notebook.time_calls (the grader's timing code), and a
    kernel it runs comes from compile_kernel (loaded as the grader loads it): a notebook's own
    event pairs or tvm.compile results would measure something else than the grader."""
    for src in (_source(c) for c in _notebook(root, lab)["cells"] if c["cell_type"] == "code"):
        assert "elapsed_time(" not in src and "median_ms" not in src, src[:300]
        if "time_calls(" in src:
            assert "tvm.compile(" not in src, src[:300]


def test_what_notebooks_and_the_readme_write_is_git_ignored(root):
    """Plots the notebooks save beside themselves, and what the README's commands write (every path
    a command line of the README names after --json, --gradescope, --out or as a folder of
    submissions)."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(root, ".git")):
        pytest.skip("not a git checkout")
    paths = ["results/lab1_roofline/alice/report.json", "results-slurm/lab1_roofline/tasks.json"]
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    written = re.findall(r"--(?:json|gradescope|out) ([\w./-]+)", readme)
    written += re.findall(r"--submission (submissions/[\w./-]+)", readme)
    assert "grader-results/alice-lab1.json" in written and any(w.startswith("submissions/") for w in written), written
    paths += [w.rstrip("/") + ("/x.json" if w.endswith("/") else "") for w in written
              if not w.startswith(("F", "FILE", "DIR", "path/", "reports/")) and "<" not in w]   # reports/: the course's records
    for lab in LABS:
        for src in (_source(c) for c in _notebook(root, lab)["cells"] if c["cell_type"] == "code"):
            for name in re.findall(r"""["']([\w{}]+\.png)["']""", src):
                name = re.sub(r"\{[^}]*\}", "0", name)
                paths += [f"assignments/{lab}/{name}", f"solutions/{lab}/{name}"]
    assert len(paths) > 10
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=root, input="\n".join(paths),
                          capture_output=True, text=True)
    assert sorted(proc.stdout.split()) == sorted(paths), set(paths) - set(proc.stdout.split())


_STATED_CREDIT = re.compile(r"full credit[^.]*?\bat (\d+(?:\.\d+)?)x")


@pytest.mark.parametrize("lab", LABS)
def test_a_speed_threshold_the_notebook_states_is_the_specs(root, lab):
    """A ratio the notebook's text gives as full credit is one of the lab's threshold rows (Lab 2's
    text once said 0.95x where its spec said 0.85x)."""
    rows = {t.full for p in spec.load(lab).parts for t in p.thresholds.values()}
    for cell in _notebook(root, lab)["cells"]:
        if cell["cell_type"] == "markdown":
            for stated in _STATED_CREDIT.findall(_source(cell).replace("\n", " ")):
                assert float(stated) in rows, f"{lab}: the notebook states full credit at {stated}x; the spec's rows: {sorted(rows)}"
