"""The container image: the Dockerfile, which no test can build (no Docker engine).

Its stages, user and entrypoint are checked, and its install step is run as written,
from the build context ``.dockerignore`` lets through, and the installed
``runguard serve`` is started with the image's environment and answers over TLS.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from harness import REPO
from harness.manifests_base import deployment_pod

from webhook.cli import main


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        joined.append(current + stripped)
        current = ""
    assert not current, "Dockerfile ends inside a continued line"
    out = []
    for text in joined:
        keyword, _, rest = text.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def stage_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            for word in shlex.split(rest):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def test_dockerfile_is_multi_stage_non_root_and_runs_runguard_serve() -> None:
    instructions = dockerfile_instructions()
    args = dict(rest.split("=", 1) for kw, rest in instructions if kw == "ARG" and "=" in rest)
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", args["PYTHON_IMAGE"])
    stages = dockerfile_stages()
    assert len(stages) >= 2
    build, final = stages[0], stages[-1]
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    final_keywords = [kw for kw, _ in final]
    # Nothing runs in the final stage: no package manager, compiler or cache gets in.
    assert "RUN" not in final_keywords
    assert ("COPY", "--from=build /opt/runguard /opt/runguard") in final
    (user,) = [rest for kw, rest in final if kw == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or gid.isdigit())
    (entrypoint,) = [rest for kw, rest in final if kw == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["runguard", "serve"]
    assert not [kw for kw in final_keywords if kw == "CMD"]
    # The image's user is the Deployment's.
    security = deployment_pod()["spec"]["securityContext"]
    assert (int(uid), int(gid)) == (security["runAsUser"], security["runAsGroup"])


def test_dockerfile_env_matches_the_deployment() -> None:
    env = stage_env(dockerfile_stages()[-1])
    (container,) = deployment_pod()["spec"]["containers"]
    deployment_env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert {k: v for k, v in env.items() if k.startswith("RUNGUARD_")} == deployment_env
    (expose,) = [rest for kw, rest in dockerfile_stages()[-1] if kw == "EXPOSE"]
    assert int(expose) == container["ports"][0]["containerPort"]
    assert env["PATH"].split(":")[0] == f"{env['VIRTUAL_ENV']}/bin"


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, regex) per line, in Docker's glob dialect (``*``, ``?``, ``**``)."""
    patterns = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line[1:] if negated else line
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif glob.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif glob[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif glob[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(glob[i]), i + 1
        patterns.append((not negated, re.compile(regex.strip("/"))))
    return patterns


def in_build_context(relative: str) -> bool:
    """Docker's rule: the last pattern matching the path, or a parent of it, decides."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for excludes, regex in dockerignore_patterns():
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = excludes
    return not excluded


def build_context(into: Path) -> list[str]:
    copied = []
    for path in sorted(REPO.rglob("*")):
        relative = path.relative_to(REPO).as_posix()
        if path.is_file() and not relative.startswith((".git/", ".venv/")):
            if in_build_context(relative):
                (into / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into / relative)
                copied.append(relative)
    return copied


def test_build_context_holds_what_the_image_needs_and_no_more(tmp_path: Path) -> None:
    copied = build_context(tmp_path)
    assert "pyproject.toml" in copied
    assert "webhook/cli/serve.py" in copied
    assert any(c.startswith("webhook/policy/") and c.endswith(".json") for c in copied)
    for c in copied:
        assert c in ("pyproject.toml", "README.md", "requirements-image.lock") or c.startswith(
            "webhook/"
        ), c
        assert "__pycache__" not in c and not c.endswith(".pyc"), c
    # Every COPY source of the build stage is in the context (else `docker build` fails).
    for keyword, rest in dockerfile_stages()[0]:
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for source in sources:
                assert (tmp_path / source).exists(), f"COPY {source}: not in the build context"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "ConnectTimeoutError",
    "Read timed out",
)


@pytest.mark.slow
def test_image_install_step_and_entrypoint_work(tmp_path: Path) -> None:
    """The build stage's RUN, as written, then the final stage's ENTRYPOINT and ENV."""
    context = tmp_path / "src"
    context.mkdir()
    build_context(context)
    build, final = dockerfile_stages()[0], dockerfile_stages()[-1]
    (install,) = [rest for kw, rest in build if kw == "RUN" and "pip" in rest]
    venv = tmp_path / "opt" / "runguard"
    shim = tmp_path / "bin"  # `python` in the image is the base image's interpreter
    shim.mkdir()
    (shim / "python").symlink_to(sys.executable)
    env = {
        **os.environ,
        **stage_env(build),
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{shim}:{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["sh", "-c", install], cwd=context, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode and any(e in done.stdout + done.stderr for e in NETWORK_ERRORS):
        pytest.skip("the package index cannot be reached")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (venv / "bin" / "pip").exists()

    # The final stage: its ENV, with the mounted files where a test can put them.
    out = tmp_path / "tls"
    assert main(["certs", "--out", str(out), "--host", "127.0.0.1"]) == 0
    port = free_port()
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("RUNGUARD_")}
    image_env = stage_env(final)
    run_env.update(image_env)
    run_env.update(
        {
            "PATH": image_env["PATH"].replace("/opt/runguard", str(venv)),
            "RUNGUARD_POLICY_DIR": str(REPO / "policies"),
            "RUNGUARD_CERT_FILE": str(out / "tls.crt"),
            "RUNGUARD_KEY_FILE": str(out / "tls.key"),
            "RUNGUARD_BIND": f"127.0.0.1:{port}",
            "RUNGUARD_WORKERS": "1",
        }
    )
    (entrypoint,) = [json.loads(rest) for kw, rest in final if kw == "ENTRYPOINT"]
    executable = shutil.which(entrypoint[0], path=run_env["PATH"])
    assert executable == str(venv / "bin" / "runguard")
    server = subprocess.Popen(
        [executable, *entrypoint[1:]],
        env=run_env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        context_tls = ssl.create_default_context(cafile=str(out / "ca.crt"))
        status = None
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
        while status is None and server.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", context=context_tls, timeout=5
                ) as response:
                    status = response.status
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        assert status == 200, server.stderr.read().decode() if server.poll() is not None else ""
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        if server.stderr:
            server.stderr.close()


# --- the image itself: `make image` (scripts/build-image.sh), run as a kubelet runs it ---


def podman_env() -> dict[str, str]:
    """podman with the containers.conf build-image.sh writes (runc, rlimits this host
    allows)."""
    cache = os.environ.get("RUNGUARD_IMAGE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "runguard" / "image"
    )
    return {**os.environ, "CONTAINERS_CONF": str(Path(cache) / "containers.conf")}


@pytest.fixture(scope="module")
def built_image() -> str:
    """``make image``: the Dockerfile built with podman on a base made by mmdebstrap
    (cached in ~/.cache/runguard/image; the tools installed by scripts/image-tools.sh)."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-image.sh")],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, env=podman_env(),
        check=False,
    )  # fmt: skip
    assert not check or done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_the_image_is_tagged_with_the_version_and_runs_as_the_deployment_says(
    built_image: str,
) -> None:
    import webhook

    assert built_image == f"localhost/runguard:{webhook.__version__}"
    (config,) = json.loads(podman("image", "inspect", built_image).stdout)
    security = deployment_pod()["spec"]["securityContext"]
    assert config["Config"]["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"
    assert config["Config"]["Entrypoint"] == ["runguard", "serve"]
    # The locked versions, no pip of the venv's own (the Dockerfile's RUN says so).
    frozen = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "/opt/runguard/bin/python",
        built_image, "-c",
        "import importlib.metadata as m, os, json; print(json.dumps(["
        "{d.metadata['Name'].lower(): d.version for d in m.distributions()},"
        "os.path.exists('/opt/runguard/bin/pip')]))",
    ).stdout  # fmt: skip
    versions, has_pip = json.loads(frozen)
    locked = dict(
        re.findall(r"^([a-z0-9._-]+)==([^\s\\]+)", (REPO / "requirements-image.lock").read_text(),
                   re.M)
    )  # fmt: skip
    installed = {name.replace("_", "-"): v for name, v in versions.items()}
    assert locked
    for name, version in locked.items():
        assert installed.get(name.replace("_", "-")) == version, name
    assert versions["runguard"] == webhook.__version__ and not has_pip


@pytest.mark.slow
@pytest.mark.parametrize("fs_group", [True, False], ids=["fsGroup", "no-fsGroup"])
def test_the_image_serves_with_the_secret_mounted_as_a_kubelet_mounts_it(
    built_image: str, tmp_path: Path, fs_group: bool
) -> None:
    """The TLS files as a kubelet writes the Secret volume (root-owned, defaultMode 0440;
    group fsGroup when the Pod has one), the container hardened as the Deployment's:
    ready with the fsGroup, and the crash issue 20 saw without it."""
    security = deployment_pod()["spec"]["securityContext"]
    tls = tmp_path / "tls"
    assert main(["certs", "--out", str(tls), "--host", "127.0.0.1"]) == 0
    group = security["fsGroup"] if fs_group else 0
    for path in (tls, *tls.iterdir()):
        os.chown(path, 0, group)
        path.chmod(0o750 if path.is_dir() else 0o440)
    port = free_port()
    name = f"runguard-test-{os.getpid()}-{port}"
    podman(
        "run", "-d", "--name", name, "--network", "host", "--read-only",
        "--tmpfs", "/tmp:rw,size=64m", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "-v", f"{REPO / 'policies'}:/etc/runguard/policies:ro",
        "-v", f"{tls}:/etc/runguard/tls:ro",
        "-e", f"RUNGUARD_BIND=127.0.0.1:{port}", "-e", "RUNGUARD_WORKERS=1",
        built_image,
    )  # fmt: skip
    try:
        context_tls = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        status, state = None, "running"
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
        while status is None and state == "running" and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", context=context_tls, timeout=5
                ) as response:
                    status = response.status
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
                state = podman("inspect", name, "--format", "{{.State.Status}}").stdout.strip()
        logs = podman("logs", name).stderr
        if fs_group:
            assert status == 200, logs[-3000:]
        else:
            # podman says "stopped" for a moment before "exited"
            assert status is None and state in ("exited", "stopped"), logs[-3000:]
            assert "Traceback" not in logs, logs[-3000:]
            assert "Permission denied: '/etc/runguard/tls/tls.crt'" in logs
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)
