"""The two images, checked without a Docker engine: the Dockerfiles parse, their entrypoints are
the project's console scripts, base images are pinned by digest, the worker gets the project's
CUDA torch and the controller no torch at all, and .dockerignore keeps the context small.
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from tests.support.repo import REPO

pytestmark = pytest.mark.pure

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGES = {"Dockerfile.worker": "decodebench-worker", "Dockerfile.controller": "decodebench"}
PINNED = re.compile(r"^[\w./-]+:(?P<tag>[\w.-]+)@sha256:[0-9a-f]{64}$")
# CUDA of torch's default Linux wheels on PyPI (from their metadata: torch 2.13.0 and 2.14.0, vLLM
# 0.33's, require cuda-toolkit==13.0.3). A torch bump must check this and the worker's CUDA base image together.
PYPI_TORCH_CUDA = {"2.13": "13.0", "2.14": "13.0"}


def parse(name: str) -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO((REPO / name).read_bytes()))


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
    source = REPO / (module.replace(".", "/") + ".py")
    if not source.exists():  # a package: its __init__.py
        source = REPO / module.replace(".", "/") / "__init__.py"
    assert source.exists(), f"{target}: no {source.relative_to(REPO)}"
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
    chart = yaml.safe_load((REPO / "charts/decodebench/values.yaml").read_text())["podSecurityContext"]
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
    makefile_pin = re.search(r"^TORCH\s*\?=\s*torch==([\w.]+)", (REPO / "Makefile").read_text(), re.M)
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


def test_controller_and_worker_run_the_same_python_and_lock_for_it():
    """The worker's python3 is its Ubuntu's (24.04: 3.12); the controller's base image and both locks agree."""
    worker_base = parse("Dockerfile.worker").parent_images[-1]
    assert re.match(r"^nvidia/cuda:[\w.-]+-ubuntu24\.04@", worker_base), "a new Ubuntu: check its python3 here"
    python = "3.12"
    assert all(
        re.match(rf"^python:{re.escape(python)}\.\d+-slim", i) for i in parse("Dockerfile.controller").parent_images
    )
    for script in ("lock-worker.sh", "lock-controller.sh"):
        assert f"--python-version {python}" in (REPO / "scripts" / script).read_text(), script


CONTROLLER_LOCK = REPO / "requirements" / "controller.lock.txt"
ACL_LOCK = REPO / "requirements" / "acl.lock.txt"
STALE = (
    "requirements/controller.lock.txt is stale: run scripts/lock-controller.sh (needs uv: pip install uv), "
    "after scripts/lock-worker.sh if the worker lock is stale too (the controller lock takes the worker's pins)"
)


def test_the_controller_lock_pins_every_dependency_with_hashes_as_the_worker_does():
    pins = lock_pins(CONTROLLER_LOCK)
    for req in map(Requirement, PYPROJECT["dependencies"]):
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{req.name} is not locked. {STALE}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req}: locked {pins[name]}. {STALE}"
    worker = lock_pins(LOCK)
    differ = {n: (v, worker[n]) for n, v in pins.items() if n in worker and worker[n] != v}
    assert not differ, f"controller and worker locks disagree (controller, worker): {differ}. {STALE}"
    acl = lock_pins(ACL_LOCK)
    assert {n: pins.get(n) for n in acl} == acl, f"requirements/acl.lock.txt differs from the controller's. {STALE}"


def test_the_acl_image_holds_all_that_decodebench_tenants_acl_imports(tmp_path):
    """Redis's init container runs `decodebench tenants acl` in the `acl` image: only the acl lock's
    packages (and the standard library) importable, as there."""
    allowed = sorted({n.replace("-", "_") for n in lock_pins(ACL_LOCK)} | {"yaml"})
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants: [{name: team-a}]\nserver: {redis_password_env: S, secret: s}\n"
        "worker: {redis_password_env: W, secret: w}\nkeda: {redis_password_env: K, secret: k}\n"
    )
    code = f"""
import importlib.abc, sys
ALLOWED = set({allowed!r}) | {{"controller", "worker"}}
class OnlyTheAclImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        raise ImportError(f"{{name}} is not in the acl image (requirements/acl.lock.txt)")
sys.meta_path.insert(0, OnlyTheAclImage())
sys.argv = ["decodebench", "tenants", "acl", {str(tenants)!r}]
from controller.cli import main
main()
"""
    env = {"PATH": os.environ["PATH"], "S": "s", "W": "w", "K": "k", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("user default off") and "user server on #" in out.stdout


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
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in IMAGES:
        for copy in instructions(parse(name), "COPY"):
            if copy.startswith("--from="):
                continue
            for source in copy.split()[:-1]:
                assert (REPO / source).exists(), f"{name}: COPY {source} does not exist"
                assert not _ignored(source.rstrip("/"), patterns), f"{name}: COPY {source} is in .dockerignore"
    for heavy in (".venv", ".git", "runs", "tests", "examples", "charts", ".tools", "controller/__pycache__"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the Docker daemon"


# --- the worker's torch/CUDA variants, its lock file, its layers and labels ---------------------

VARIANTS = sorted((REPO / "docker" / "worker-variants").glob("*.args"))
LOCK = REPO / "requirements" / "worker.lock.txt"


def variant_args(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def torch_cuda(torch: str, index: str) -> str:
    """The CUDA a torch build is for: the cuXYZ of its index, or PyPI's default build."""
    if not index:
        return PYPI_TORCH_CUDA[".".join(torch.split(".")[:2])]
    return "{}.{}".format(*re.search(r"/cu(\d+)(\d)$", index).groups())


@pytest.mark.parametrize("variant", VARIANTS, ids=[p.stem for p in VARIANTS])
def test_each_documented_torch_cuda_variant_parses_and_fits_together(variant):
    args = variant_args(variant)
    assert set(args) == {"CUDA_IMAGE", "TORCH_VERSION", "TORCH_INDEX_URL"}
    df = DockerfileParser(fileobj=io.BytesIO((REPO / "Dockerfile.worker").read_bytes()), build_args=args)
    assert df.parent_images == [args["CUDA_IMAGE"]] * 2  # both stages on the variant's base
    assert PINNED.match(args["CUDA_IMAGE"]), args["CUDA_IMAGE"]
    base = re.match(r"^nvidia/cuda:(\d+\.\d+)\.\d+-(runtime|cudnn-runtime)-ubuntu", args["CUDA_IMAGE"])
    assert base and base.group(1) == torch_cuda(args["TORCH_VERSION"], args["TORCH_INDEX_URL"])
    extra = [Requirement(r) for r in PYPROJECT["optional-dependencies"]["worker"]]
    (extra_torch,) = [r for r in extra if r.name == "torch"]
    assert extra_torch.specifier.contains(args["TORCH_VERSION"])
    default = variant_args(REPO / "docker" / "worker-variants" / "default.args")
    assert default == {k: arg_default(parse("Dockerfile.worker"), k) for k in default}, "default.args = the ARGs"


def test_the_torch_29_cuda_128_reference_variant_exists():
    args = variant_args(REPO / "docker" / "worker-variants" / "torch2.9-cu128.args")
    assert args["TORCH_VERSION"].startswith("2.9.") and args["TORCH_INDEX_URL"].endswith("/cu128")
    assert "torch2.9-cu128.args" in (REPO / "docs" / "deploy.md").read_text()


@pytest.mark.parametrize(
    "name,lock", [("Dockerfile.worker", "worker.lock.txt"), ("Dockerfile.controller", "controller")]
)
def test_dependencies_install_from_the_hashed_lock_before_the_source_is_copied(name, lock):
    steps = [(i["instruction"], i["value"]) for i in parse(name).structure]
    lock_copy = next(n for n, (k, v) in enumerate(steps) if k == "COPY" and lock in v)
    lock_install = next(n for n, (k, v) in enumerate(steps) if k == "RUN" and "--require-hashes" in v)
    source = next(n for n, (k, v) in enumerate(steps) if k == "COPY" and v.startswith("worker/"))
    assert lock_copy < lock_install < source, steps
    project = next(v for k, v in steps if k == "RUN" and "pip install --no" in v and "-r " not in v)
    assert "--no-deps" in project and "pip check" in project  # nothing resolved after the lock


def lock_pins(path: Path) -> dict[str, str]:
    """A hashed lock's pins, name -> version; every entry `==` with its sha256 hashes."""
    text = path.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        req = Requirement(line.split(" --hash")[0].strip())
        assert "--hash=sha256:" in line, f"{path.name}: {req.name} has no hash"
        (spec,) = req.specifier
        assert spec.operator == "==", req
        pins[req.name.lower().replace("_", "-")] = spec.version
    return pins


def test_the_lock_pins_every_dependency_with_hashes():
    pins = lock_pins(LOCK)
    wanted = [Requirement(r) for r in PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["worker"]]
    for req in wanted:
        name = req.name.lower().replace("_", "-")
        if name == "torch":
            assert name not in pins  # from the index of the chosen CUDA build, before the lock
            continue
        assert name in pins, f"{req.name} is not in requirements/worker.lock.txt (run scripts/lock-worker.sh)"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req}: locked {pins[name]}"
    assert not any(n.startswith(("nvidia-cu", "triton")) for n in pins)  # CUDA-build specific: torch's


def test_the_worker_image_carries_oci_labels():
    labels = parse("Dockerfile.worker").labels
    for key in ("title", "source", "version", "revision", "licenses", "base.name"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert (
        labels["org.opencontainers.image.licenses"]
        == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    )


VLLM_LOCK = REPO / "requirements" / "worker-vllm.lock.txt"


def test_the_vllm_worker_image_is_the_worker_dockerfile_with_vllms_lock_and_torch():
    """docker/vllm.args builds the vLLM worker image (docs/deploy.md): the same stages and base, ENGINE=vllm
    choosing requirements/worker-vllm.lock.txt, vLLM's torch before it; the lock pins vLLM, its transformers
    within the worker extra, and every dependency of the project with hashes, torch's CUDA packages left out."""
    args = variant_args(REPO / "docker" / "vllm.args")
    assert set(args) == {"ENGINE", "TORCH_VERSION", "TORCH_INDEX_URL"} and args["ENGINE"] == "vllm"
    df = DockerfileParser(fileobj=io.BytesIO((REPO / "Dockerfile.worker").read_bytes()), build_args=args)
    assert df.parent_images == [arg_default(parse("Dockerfile.worker"), "CUDA_IMAGE")] * 2
    assert any("worker-vllm.lock.txt" in c for c in instructions(df, "COPY"))
    assert any("vllm) lock=worker-vllm" in r and "--require-hashes" in r for r in instructions(df, "RUN"))
    base = re.match(r"^nvidia/cuda:(\d+\.\d+)\.", df.parent_images[-1])
    assert base and base.group(1) == torch_cuda(args["TORCH_VERSION"], args["TORCH_INDEX_URL"])
    pins = lock_pins(VLLM_LOCK)
    assert pins["vllm"] == "0.33.0" and "torch" not in pins and not any(n.startswith("triton") for n in pins)
    for req in (Requirement(r) for r in PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["worker"]):
        name = req.name.lower().replace("_", "-")
        if name != "torch":
            assert name in pins, f"{req.name} is not in {VLLM_LOCK.name} (run scripts/lock-worker-vllm.sh)"
            assert req.specifier.contains(pins[name], prereleases=True), f"{req}: locked {pins[name]}"
    assert Requirement("torch>=2.3").specifier.contains(args["TORCH_VERSION"])  # the worker extra's torch
