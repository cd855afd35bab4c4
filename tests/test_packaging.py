"""The package as a user installs it: a wheel built from the files git tracks, and nothing else,
installed in a fresh virtual environment, runs ``symattn derive``, ``symattn check`` and the
library, and gives what this source tree gives.

The fresh environment is made without pip and downloads nothing. Its dependencies come from a
``.pth`` file naming the directories this interpreter has each of the wheel's ``Requires-Dist``
in; a path in a ``.pth`` file starts none of that directory's own ``.pth`` files, so an editable
install of this checkout there stays out, and the test checks that ``symattn`` in the
environment is the wheel's. The wheel is installed by this interpreter's pip (``--python``).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from _child import HANG_S, ROOT, run_cli

pytestmark = pytest.mark.xdist_group("packaging")  # one wheel and one environment for the file's tests

EXAMPLE = ROOT / "worked_examples" / "causal_4_tokens.yaml"

# Answers to the example: all right, and the README's with one slip in S (S[2,1] is 12).
RIGHT_ANSWERS = """\
S: [[2, 12, 8, 6], [12, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]
S_scaled: [[1, 6, 4, 3], [6, 4, 8, 2], [4, 8, 8, 4], [3, 2, 4, 1]]
A:
  - [1, 0, 0, 0]
  - ["1/(1 + e^(-2))", 0.1192, 0, 0]
  - [0.0091, 0.4955, 0.4955, 0]
  - [0.237, 0.087, 0.644, 0.032]
"""
SLIP_ANSWERS = RIGHT_ANSWERS.replace("[12, 8, 16, 4]", "[10, 8, 16, 4]").replace("[6, 4, 8, 2]", "[5, 4, 8, 2]")

# What a child of the test runs with: none of this checkout on its path, one thread per library.
CHILD_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
CHILD_ENV.update(PYTHONNOUSERSITE="1", COLUMNS="200", NO_COLOR="1", OPENBLAS_NUM_THREADS="1",
                 OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")


def _run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    """A child process, its output captured; HANG_S only ends one that is stuck."""
    return subprocess.run([str(a) for a in args], cwd=cwd, env=CHILD_ENV, capture_output=True, text=True,
                          timeout=HANG_S, stdin=subprocess.DEVNULL)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.args}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


def _tracked_files() -> list[str]:
    """The checkout's files as git tracks them (a fresh clone has these and no others)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: no clean checkout to build the wheel from")
    proc = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, timeout=HANG_S)
    if proc.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: no clean checkout to build the wheel from")
    return [name for name in proc.stdout.decode("utf-8").split("\0") if name]


def _dependency_dirs(wheel: Path) -> list[str]:
    """The directories this interpreter has the wheel's dependencies in (extras left out)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(archive.read(metadata).decode("utf-8")).get_all("Requires-Dist") or []
    dirs = []
    for requirement in requires:
        if "extra ==" in requirement:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
        try:
            where = str(importlib.metadata.distribution(name).locate_file(""))
        except importlib.metadata.PackageNotFoundError:
            raise AssertionError(f"symattn's dependency {name} is not installed here: the test downloads nothing")
        if where not in dirs:
            dirs.append(where)
    return dirs


def _can_build_here() -> bool:
    """Whether this environment's setuptools can build the wheel itself: setuptools 70.1 or later
    (bdist_wheel built in), or an older one with the wheel package; a fresh venv of Python 3.11
    has setuptools 65 without wheel."""
    import importlib.util

    try:
        return (importlib.util.find_spec("setuptools") is not None
                and (importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
                     or importlib.util.find_spec("wheel") is not None))
    except ImportError:
        return False


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh environment's python, its site-packages, the checkout copy's files)."""
    files = _tracked_files()
    base = tmp_path_factory.mktemp("packaging")
    checkout = base / "checkout"
    for name in files:
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is left out, as in a commit of it
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name, follow_symlinks=False)
    wheels = base / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, checkout]
    if _can_build_here():
        build[4:4] = ["--no-build-isolation", "--no-index"]  # the build backend is here: no download
    # else pip fetches setuptools into an isolated build environment, as `pip install .` does
    _ok(_run(build, base))
    (wheel,) = wheels.glob("symattn-*.whl")

    venv = base / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", venv], base))
    python = venv / "bin" / "python"
    site = Path(_ok(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base))
                .stdout.strip())
    (site / "symattn_test_dependencies.pth").write_text("".join(d + "\n" for d in _dependency_dirs(wheel)))
    _ok(_run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], base))
    work = base / "work"  # the children's directory: no symattn/ in it to be imported instead
    work.mkdir()
    return wheel, python, site, files, work


def test_the_wheel_holds_every_module_and_the_data(installed):
    wheel, _, _, files, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    wanted = {f for f in files
              if f.startswith("symattn/") and (f.endswith(".py") or re.fullmatch(r"symattn/data/[^/]*\.yaml", f))}
    # the data and a sub-subpackage (symattn/problem/checkpoints/) are among them: the list is the package's
    assert any(f.startswith("symattn/data/") for f in wanted) and any(f.count("/") >= 3 for f in wanted), sorted(wanted)
    missing = sorted(wanted - names)
    assert not missing, ("the wheel lacks these files of the package (does pyproject.toml find every package,"
                         " and its package-data the data?):\n  " + "\n  ".join(missing))
    stray = sorted(n for n in names if not n.startswith(("symattn/", "symattn-")))
    assert not stray, f"the wheel holds files outside the package: {stray}"


def test_the_environment_imports_the_wheels_symattn(installed):
    _, python, site, _, work = installed
    where = _ok(_run([python, "-c", "import symattn; print(symattn.__file__)"], work)).stdout.strip()
    assert Path(where) == site / "symattn" / "__init__.py", f"symattn came from {where}, not from the wheel"


def test_the_installed_command_derives_as_the_source_tree_does(installed):
    _, python, _, _, work = installed
    symattn = python.parent / "symattn"  # the console script the wheel installs
    for options in ([], ["--format", "json"]):
        from_wheel = _ok(_run([symattn, "derive", EXAMPLE, *options], work))
        from_source = run_cli(["derive", EXAMPLE, *options], cwd=work)
        assert from_source.code == 0, from_source.err
        assert from_wheel.stdout == from_source.out and from_wheel.stdout.strip(), options
        assert from_wheel.stderr == from_source.err, options


def test_the_installed_command_checks_answers_as_the_source_tree_does(installed):
    _, python, _, _, work = installed
    symattn = python.parent / "symattn"
    for name, answers, code, verdict in (("right.yaml", RIGHT_ANSWERS, 0, "3 of 3 stages right"),
                                         ("slip.yaml", SLIP_ANSWERS, 1, "S[2,1]: you wrote 10, expected 12")):
        (work / name).write_text(answers, encoding="utf-8")
        from_wheel = _run([symattn, "check", EXAMPLE, name], work)
        from_source = run_cli(["check", EXAMPLE, name], cwd=work)
        assert from_wheel.returncode == from_source.code == code, (from_wheel.stdout, from_wheel.stderr)
        assert verdict in from_wheel.stdout, from_wheel.stdout
        assert (from_wheel.stdout, from_wheel.stderr) == (from_source.out, from_source.err)


def test_the_installed_library_generates_as_the_source_tree_does(installed):
    _, python, _, _, work = installed
    proc = _ok(_run([python, "-c", "import symattn; symattn.generate(2)"], work))
    assert proc.stdout == proc.stderr == ""
    show = "import symattn; print(''.join(p.to_yaml() for p in symattn.generate(2)), end='')"
    from_wheel = _ok(_run([python, "-c", show], work)).stdout
    from_source = subprocess.run([sys.executable, "-c", show], cwd=work, env=dict(CHILD_ENV, PYTHONPATH=str(ROOT)),
                                 capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)
    assert from_source.returncode == 0, from_source.stderr
    assert from_wheel == from_source.stdout and from_wheel.count("title:") == 2
