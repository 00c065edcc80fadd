"""The two images, checked without a Docker engine: the Dockerfiles parse, their entrypoints are
the project's console scripts, base images are pinned by digest, the worker gets the project's
CUDA torch and the controller no torch at all, and .dockerignore keeps the context small.
"""

from __future__ import annotations

import ast
import io
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IMAGES = {"Dockerfile.worker": "decodebench-worker", "Dockerfile.controller": "decodebench"}
PINNED = re.compile(r"^[\w./-]+:(?P<tag>[\w.-]+)@sha256:[0-9a-f]{64}$")
# CUDA of torch's default Linux wheels on PyPI (from their metadata: torch 2.13.0 requires
# cuda-toolkit==13.0.3). A torch bump must check this and the worker's CUDA base image together.
PYPI_TORCH_CUDA = {"2.13": "13.0"}


def parse(name: str) -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO((ROOT / name).read_bytes()))


def instructions(df: DockerfileParser, kind: str) -> list[str]:
    return [i["value"] for i in df.structure if i["instruction"] == kind]


def final_stage(df: DockerfileParser) -> list[dict]:
    froms = [n for n, i in enumerate(df.structure) if i["instruction"] == "FROM"]
    return df.structure[froms[-1] :]


def arg_default(df: DockerfileParser, name: str) -> str:
    for value in instructions(df, "ARG"):
        key, _, default = value.partition("=")
        if key == name:
            return default
    raise AssertionError(f"no ARG {name}")


@pytest.mark.parametrize("name", IMAGES)
def test_entrypoint_is_a_console_script_of_the_project(name):
    df = parse(name)
    (entrypoint,) = instructions(df, "ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == [IMAGES[name]], "exec form, the console script alone"
    target = PYPROJECT["scripts"][IMAGES[name]]
    module, func = target.split(":")
    source = ROOT / (module.replace(".", "/") + ".py")
    if not source.exists():  # a package: its __init__.py
        source = ROOT / module.replace(".", "/") / "__init__.py"
    assert source.exists(), f"{target}: no {source.relative_to(ROOT)}"
    defined = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
    defined |= {
        t.id
        for n in ast.walk(ast.parse(source.read_text()))
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert func in defined, f"{target}: {module} defines no {func}"


@pytest.mark.parametrize("name", IMAGES)
def test_base_images_are_pinned_by_tag_and_digest(name):
    df = parse(name)
    assert df.parent_images, "no FROM"
    for image in df.parent_images:
        match = PINNED.match(image)
        assert match, f"{name}: base image {image!r} is not name:tag@sha256:<digest>"
        assert match["tag"] != "latest"


@pytest.mark.parametrize("name", IMAGES)
def test_runs_as_the_non_root_user_the_chart_expects(name):
    (user,) = [i["value"] for i in final_stage(parse(name)) if i["instruction"] == "USER"]
    chart = yaml.safe_load((ROOT / "charts/decodebench/values.yaml").read_text())["podSecurityContext"]
    assert user == f"{chart['runAsUser']}:{chart['runAsGroup']}"  # numeric: runAsNonRoot can check it


@pytest.mark.parametrize("name", IMAGES)
def test_layers_stay_small(name):
    df = parse(name)
    for run in instructions(df, "RUN"):
        if "apt-get install" in run:
            assert "--no-install-recommends" in run and "rm -rf /var/lib/apt/lists/*" in run, run
    env = " ".join(instructions(df, "ENV"))
    assert "PIP_NO_CACHE_DIR=1" in env
    final = final_stage(df)
    # Multi-stage: the final image copies the built virtualenv and runs no pip itself.
    assert any(i["instruction"] == "COPY" and i["value"].startswith("--from=build /opt/venv") for i in final)
    assert not any(i["instruction"] == "RUN" and "pip install" in i["value"] for i in final)
    assert len(instructions(df, "RUN")) <= 5


def test_worker_gets_the_projects_cuda_torch_and_the_worker_extra():
    df = parse("Dockerfile.worker")
    torch = arg_default(df, "TORCH_VERSION")
    makefile_pin = re.search(r"^TORCH\s*\?=\s*torch==([\w.]+)", (ROOT / "Makefile").read_text(), re.M)
    assert makefile_pin and torch == makefile_pin.group(1), "the image's torch is the project's (Makefile) pin"
    extra = [Requirement(r) for r in PYPROJECT["optional-dependencies"]["worker"]]
    (extra_torch,) = [r for r in extra if r.name == "torch"]
    assert extra_torch.specifier.contains(torch), f"torch {torch} outside the worker extra's {extra_torch.specifier}"
    runs = instructions(df, "RUN")
    assert any('pip install "torch==${TORCH_VERSION}"' in r for r in runs)
    assert any('".[worker]"' in r and "--constraint" in r for r in runs), "the extra installs without replacing torch"
    base = df.parent_images[-1]
    cuda = re.match(r"^nvidia/cuda:(\d+\.\d+)\.\d+-(runtime|cudnn-runtime)-ubuntu", base)
    assert cuda, f"worker base {base} is not a CUDA runtime image on Ubuntu (the chart runs /bin/bash)"
    index = arg_default(df, "TORCH_INDEX_URL")
    wanted = (
        PYPI_TORCH_CUDA[".".join(torch.split(".")[:2])]
        if not index
        else "{}.{}".format(*re.search(r"/cu(\d+)(\d)$", index).groups())
    )
    assert cuda.group(1) == wanted, f"torch {torch} is built for CUDA {wanted}, the base image has {cuda.group(1)}"


def test_controller_image_installs_no_torch():
    df = parse("Dockerfile.controller")
    base = " ".join(PYPROJECT["dependencies"]).lower()
    assert "torch" not in base and "transformers" not in base
    installs = [r for r in instructions(df, "RUN") if "pip install" in r]
    assert installs and all("[" not in r and "torch" not in r for r in installs), installs
    assert re.match(r"^python:3\.11[\w.-]*-slim", df.parent_images[-1])


def _glob(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex: `*` and `?` stay within a path segment, `**/` spans any."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path, or a folder above it, decides; `!` re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _glob(pattern.lstrip("!").rstrip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_what_the_images_copy():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in IMAGES:
        for copy in instructions(parse(name), "COPY"):
            if copy.startswith("--from="):
                continue
            for source in copy.split()[:-1]:
                assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist"
                assert not _ignored(source.rstrip("/"), patterns), f"{name}: COPY {source} is in .dockerignore"
    for heavy in (".venv", ".git", "runs", "tests", "examples", "charts", ".tools", "controller/__pycache__"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the Docker daemon"
