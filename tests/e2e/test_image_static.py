"""Static checks of the image definitions: linters, and the files agreeing with each other.

    python -m pytest tests/e2e/test_image_static.py

hadolint (Dockerfile), shellcheck (every shell script), actionlint (workflows), spython
(Apptainer definitions against the Dockerfile) and python-hcl2 (bake targets). The tools
come from requirements/test.txt; a missing tool fails the test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import hcl2
import pytest
from spython.main.parse.parsers import DockerParser, SingularityParser

from tests.helpers import REPO
from tests.helpers.apptainer_def import header, rendered
from workload.caches import CACHE_KEYS

ROOT = REPO
DOCKERFILE = ROOT / "Dockerfile"
DEFS = sorted((ROOT / "apptainer").glob("*.def"))
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
VENV_BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{VENV_BIN}:{shutil.os.environ.get('PATH', '')}")
    assert found, f"{name} is not installed: pip install -r requirements/test.txt"
    return found


def lint(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"


def test_hadolint_finds_nothing_in_the_dockerfile():
    lint([tool("hadolint"), "--config", ".hadolint.yaml", "Dockerfile"])


def shell_scripts() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    scripts = []
    for name in listed:
        path = ROOT / name
        if not path.is_file() or ".venv" in path.parts:
            continue
        first = path.read_bytes()[:64].split(b"\n")[0]
        if name.endswith(".sh") or (name.startswith("jobs/") and re.search(rb"\b(ba)?sh\b", first)):
            scripts.append(name)
    return scripts


def test_shellcheck_finds_nothing_in_any_shell_script():
    scripts = shell_scripts()
    assert "container/install-workload.sh" in scripts
    lint([tool("shellcheck"), "--external-sources", *scripts])


@pytest.mark.parametrize("step", ["deps", "package"])
def test_install_script_stops_each_step_on_a_python_without_torch(tmp_path, step):
    """The package step reads torch's distribution instead of importing it (half a minute
    under QEMU), and still stops before pip on a base without torch, naming the fix."""
    shim = tmp_path / "python"  # this interpreter without its site-packages: no torch
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    shim.chmod(0o755)
    proc = subprocess.run(["bash", "container/install-workload.sh", step, str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True,
                          env={**shutil.os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{shim} has no torch that imports (step {step}); use a base image with torch" \
        in proc.stderr, proc.stderr
    assert "installed:" not in proc.stdout, proc.stdout


def test_actionlint_finds_nothing_in_the_workflows():
    assert WORKFLOWS, "no workflow under .github/workflows"
    env_path = f"{VENV_BIN}:{shutil.os.environ.get('PATH', '')}"  # shellcheck for run: steps
    proc = subprocess.run([tool("actionlint"), *map(str, WORKFLOWS)], cwd=ROOT,
                          capture_output=True, text=True,
                          env={**shutil.os.environ, "PATH": env_path})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The linter really checks: an undefined context property is an error."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n"
                   "    steps:\n      - run: echo ${{ github.no_such_thing }}\n")
    proc = subprocess.run([tool("actionlint"), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1 and "no_such_thing" in proc.stdout


# --- the Dockerfile ---------------------------------------------------------------------

def dockerfile_recipe():
    return DockerParser(str(DOCKERFILE)).recipe["spython-base"]


def dockerfile_labels() -> dict[str, str]:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(), re.M))
    labels = {}
    for (line,) in dockerfile_recipe().labels:
        key, _, value = line.rstrip(" \\").partition("=")
        value = value.strip('"')
        labels[key] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), value)
    return labels


def test_every_dockerfile_arg_has_a_comment_above_it():
    lines = DOCKERFILE.read_text().splitlines()
    bare = [line for i, line in enumerate(lines)
            if line.startswith("ARG ") and "=" in line and not lines[i - 1].startswith("#")]
    assert bare == []


# The ARGs the RUN steps read. Every RUN sees every ARG declared before it, so an ARG
# whose value changes with each build (REVISION, CREATED) declared above a RUN builds that
# step again each time: the dependencies' pip run (emulated, minutes, for arm64) included.
RUN_ARGS = {"INSTALL_DALI"}


def test_no_arg_that_changes_with_each_build_is_declared_above_a_run_step():
    lines = DOCKERFILE.read_text().splitlines()
    last_run = max(i for i, line in enumerate(lines) if line.startswith("RUN "))
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    above = {line.split()[1].split("=")[0] for line in lines[first_from:last_run]
             if line.startswith("ARG ")}
    assert above <= RUN_ARGS, f"declare {sorted(above - RUN_ARGS)} after the last RUN step"


def test_the_final_workdir_is_made_by_a_run_step():
    """podman build's default (--layers) commits a WORKDIR as configuration only and
    creates its folder when a later RUN needs it; none comes after the last WORKDIR, so
    the image would lack the folder pyxis and ch-run start in unless a RUN makes it."""
    # The instructions as written (spython's recipe turns a WORKDIR into a mkdir itself).
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    workdir = re.findall(r"^WORKDIR (\S+)$", text, re.M)[-1]
    runs = re.findall(r"^RUN (.*)$", text, re.M)
    assert any(f"mkdir -p {workdir}" in step for step in runs), (workdir, runs)


def test_dockerfile_extends_the_pinned_cuda13_ngc_pytorch_tag():
    """The default base is the CUDA 13 flavour's, and the file says how to check its torch."""
    base = dockerfile_recipe().fromHeader
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:2[6-9]\.\d\d-py3", base), base
    assert base == expand(target("_cuda13")["args"]["BASE_IMAGE"])
    text = DOCKERFILE.read_text()
    assert "digest" in text.lower()
    assert "GHSA-63cw-57p8-fm3p" in text and "_check_set_item_target" in text
    assert "NOT VERIFIED HERE" in text


def test_dockerfile_labels_carry_source_revision_version_created_and_base():
    labels = dockerfile_labels()
    for key in ("source", "revision", "version", "created", "base.name", "base.digest"):
        assert f"org.opencontainers.image.{key}" in labels


# --- Apptainer definitions --------------------------------------------------------------

def def_recipe(path: Path, **build_args: str):
    """The definition as Apptainer builds it (its build arguments filled in), parsed by
    spython, whose parser takes any line with the word "bootstrap" for the header's:
    comment lines are left out."""
    parser = SingularityParser(str(path), load=False)
    parser.lines = [line for line in rendered(path, build_args).splitlines(keepends=True)
                    if not line.lstrip().startswith("#")]
    parser.parse()
    return parser.recipe["spython-base"]


def def_labels_of(recipe) -> dict[str, str]:
    return dict(line.split(None, 1) for line in recipe.labels)


def def_labels(path: Path) -> dict[str, str]:
    return def_labels_of(def_recipe(path))


def test_there_is_a_definition_from_the_image_and_one_from_ngc():
    bases = {p.name: def_recipe(p).fromHeader for p in DEFS}
    assert dockerfile_recipe().fromHeader in bases.values()
    image = bake_variable("REGISTRY") + "/" + bake_variable("IMAGE")
    assert any(b.startswith(image + ":") for b in bases.values()), bases


@pytest.mark.parametrize("path", DEFS, ids=[p.name for p in DEFS])
def test_definition_runs_the_dockerfile_entrypoint(path):
    runscript = def_recipe(path).cmd.strip()
    assert runscript == "exec " + " ".join(dockerfile_recipe().entrypoint) + ' "$@"'


@pytest.mark.parametrize("path", DEFS, ids=[p.name for p in DEFS])
def test_definition_labels_agree_with_the_dockerfile(path):
    labels, docker = def_labels(path), dockerfile_labels()
    assert labels, "no %labels"
    for key, value in labels.items():
        expected = dockerfile_recipe().fromHeader if key.endswith("base.name") else docker[key]
        assert value == expected, key


@pytest.mark.parametrize("path", DEFS, ids=[p.name for p in DEFS])
def test_definition_help_shows_srun_and_test_is_cpu_only(path):
    text = path.read_text()
    help_text = text.split("\n%help", 1)[1].split("\n%", 1)[0]
    assert "srun" in help_text and "apptainer exec --nv" in help_text
    test_text = text.split("\n%test", 1)[1].split("\n%", 1)[0]
    assert "--device cpu" in test_text


def test_ngc_definition_sets_the_dockerfile_environment():
    ngc = next(p for p in DEFS if def_recipe(p).fromHeader == dockerfile_recipe().fromHeader)
    assert set(def_recipe(ngc).environ) == set(dockerfile_recipe().environ) - {
        e for e in dockerfile_recipe().environ if e.startswith("TORCH_CUDA_ARCH_LIST=")}


def test_the_documented_build_arguments_give_the_base_they_name():
    """The -cuda12 build of docs/images.md and the JSC page names the bake's CUDA 12 base,
    which becomes the SIF's base and its label; Olivia's build takes its pre-pulled SIF
    as a local image. The default stays the Dockerfile's base (the tests above)."""
    ngc = ROOT / "apptainer" / "hpc-train-ngc.def"
    cuda12 = "nvcr.io/nvidia/pytorch:" + bake_variable("CUDA12_BASE_TAG")
    for page in ("docs/images.md", "docs/sites/jsc-juwels-booster.md"):
        assert f"apptainer build --build-arg BASE={cuda12} hpc-train.sif {ngc.relative_to(ROOT)}" \
            in (ROOT / page).read_text(), page
    recipe = def_recipe(ngc, BASE=cuda12)
    assert (recipe.fromHeader, def_labels_of(recipe)["org.opencontainers.image.base.name"]) \
        == (cuda12, cuda12)
    local = header(rendered(ngc, {"BOOTSTRAP": "localimage", "BASE": "/cluster/x.sif"}))
    assert (local["bootstrap"], local["from"]) == ("localimage", "/cluster/x.sif")


def test_no_image_fixes_a_cache_folder():
    """A fixed folder under the host's /tmp (bound by Apptainer and Charliecloud) belongs
    to the first user whose job ran on the node: the package chooses each user's own at
    start (workload/caches.py), and a value set by the image would count as the user's."""
    environments = [dockerfile_recipe().environ] + [def_recipe(p).environ for p in DEFS]
    for environ in environments:
        names = {line.removeprefix("export ").split("=", 1)[0].strip() for line in environ}
        assert not names & set(CACHE_KEYS), environ


# --- docker-bake.hcl --------------------------------------------------------------------

def unquote(value):
    if isinstance(value, str):
        return value.strip('"')
    if isinstance(value, list):
        return [unquote(v) for v in value]
    if isinstance(value, dict):
        return {unquote(k): unquote(v) for k, v in value.items() if k != "__is_block__"}
    return value


def bake() -> dict:
    with open(ROOT / "docker-bake.hcl") as f:
        return unquote(hcl2.load(f))


def bake_variable(name: str) -> str:
    return next(v[name]["default"] for v in bake()["variable"] if name in v)


def expand(text: str) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: bake_variable(m.group(1)), text)


def target(name: str) -> dict:
    """A bake target with its inherited settings merged in (maps merge, the rest override)."""
    targets = {k: v for block in bake()["target"] for k, v in block.items()}
    merged: dict = {}
    for parent in targets[name].get("inherits", []):
        for key, value in target(parent).items():
            merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    for key, value in targets[name].items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return merged


# name: (platform, CUDA arch, base tag, its own tag)
SITE_TARGETS = {
    "gh200-cuda13": ("linux/arm64", "9.0", "26.02-py3", "dev-cuda13-gh200"),
    "a100-cuda13": ("linux/amd64", "8.0;9.0", "26.02-py3", "dev-cuda13-a100"),
    "gh200-cuda12": ("linux/arm64", "9.0", "25.06-py3", "dev-cuda12-gh200"),
    "a100-cuda12": ("linux/amd64", "8.0;9.0", "25.06-py3", "dev-cuda12-a100"),
}


def image_tags(t: dict) -> list[str]:
    prefix = bake_variable("REGISTRY") + "/" + bake_variable("IMAGE") + ":"
    tags = [expand(tag) for tag in t["tags"]]
    assert all(tag.startswith(prefix) for tag in tags), tags
    return [tag[len(prefix):] for tag in tags]


@pytest.mark.parametrize("name", SITE_TARGETS)
def test_bake_site_targets(name):
    platform, arch, base_tag, tag = SITE_TARGETS[name]
    t = target(name)
    assert t["platforms"] == [platform]
    assert t["args"]["CUDA_ARCH"] == arch
    assert expand(t["args"]["BASE_IMAGE"]) == f"nvcr.io/nvidia/pytorch:{base_tag}"
    flavour = name.rsplit("-", 1)[1]
    assert t["args"]["BASE_DIGEST"] == f"${{{flavour.upper()}_BASE_DIGEST}}"
    assert image_tags(t) == [tag]
    assert {"type=provenance,mode=max", "type=sbom"} <= set(t["attest"])
    assert t["cache-from"] and t["cache-to"]
    assert len({expand(c) for n in SITE_TARGETS for c in target(n)["cache-to"]}) == 4


def test_bake_sites_group_is_the_four_targets():
    sites = next(g["sites"] for g in bake()["group"] if "sites" in g)
    assert sorted(sites["targets"]) == sorted(SITE_TARGETS)


def test_bake_default_group_yields_one_multiarch_tag_per_flavour_and_plain_is_cuda13():
    default = next(g["default"] for g in bake()["group"] if "default" in g)
    by_name = {n: target(n) for n in default["targets"]}
    assert set(by_name) == {"cuda12", "cuda13"}
    for name, t in by_name.items():
        assert set(t["platforms"]) == {"linux/arm64", "linux/amd64"}
        assert {"type=provenance,mode=max", "type=sbom"} <= set(t["attest"])
        assert t["args"]["BASE_IMAGE"] == target(f"gh200-{name}")["args"]["BASE_IMAGE"]
    assert image_tags(by_name["cuda12"]) == ["dev-cuda12"]
    assert image_tags(by_name["cuda13"]) == ["dev-cuda13", "dev"]
