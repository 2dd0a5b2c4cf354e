"""Hot reload of the policy and the certificate, while requests flow (docs/dev/server.md,
"Endpoints")."""

from __future__ import annotations

import base64
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import requests
from cryptography import x509
from harness import (
    AtomicDir,
    RunguardServer,
    Traffic,
    admission_review,
    peer_certificate,
    run_pod,
    sample_policy,
)

from webhook.engine import mutate
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policy
from webhook.serving.policystore import PolicyPublication, PolicyState, PolicyStore
from webhook.serving.settings import ServeSettings, SettingsError, byte_size
from webhook.serving.watch import directory_signature

OLD = {"run_as_user": 1000, "memory": "1Gi"}
NEW = {"run_as_user": 2000, "memory": "2Gi"}
BAD_PROFILES = "apiVersion: runguard.io/v1\nkind: Profile\nmetadata: {name: small}\nspec:\n  resources:\n    requests: {memory: lots}\n"  # noqa: E501


def served_version(session: requests.Session, server: RunguardServer) -> tuple[int, str]:
    """(runAsUser, memory request) of a mutated run pod: which policy answered."""
    pod = run_pod()
    resp = session.post(
        server.url + "/mutate",
        data=json.dumps(admission_review(pod)),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    answer = resp.json()["response"]
    ops = json.loads(base64.b64decode(answer["patch"]))
    result = jsonpatch.apply_patch(pod, ops)
    user = result["spec"]["securityContext"]["runAsUser"]
    memory = result["spec"]["containers"][0]["resources"]["requests"]["memory"]
    return user, memory


def version(values: dict[str, Any]) -> tuple[int, str]:
    return values["run_as_user"], values["memory"]


def adopted_pids(server: RunguardServer, digest: str) -> set[int]:
    """The processes that logged serving the master's policy ``digest`` (workers)."""
    pattern = re.compile(
        rf"\[(\d+)\] \[INFO\] runguard\.server: policy adopted from the master: .*digest {digest}"
    )
    return {int(m.group(1)) for m in pattern.finditer(server.stderr)}


def digest_of(files: dict[str, str], tmp: Path) -> str:
    tmp.mkdir()
    for name, text in files.items():
        (tmp / name).write_text(text)
    return load_policy(tmp).digest


def write_files(directory: Path, files: dict[str, str]) -> None:
    """An admin copying files into place, one after the other."""
    for name, text in files.items():
        (directory / name).write_text(text)


def until_every_worker_adopted(server: RunguardServer, digest: str) -> None:
    """Until each worker logged serving ``digest``: with no traffic, an idle worker too."""
    server.wait_for(lambda: server.worker_pids() <= adopted_pids(server, digest), "every worker")


# --------------------------------------------------------------------- policy


@pytest.mark.parametrize("atomic", [False, True], ids=["plain-dir", "configmap-volume"])
def test_a_new_policy_takes_effect_in_every_worker_while_requests_flow(
    start_runguard: Any, tmp_path: Path, atomic: bool
) -> None:
    server = start_runguard(policy=sample_policy(**OLD), atomic=atomic)
    new_files = sample_policy(**NEW)
    new_digest = digest_of(new_files, tmp_path / "new")
    with Traffic(server, lambda s: served_version(s, server), max_seconds=40) as traffic:
        server.wait_for(lambda: len(traffic.results) > 20, "traffic")
        if atomic:
            assert server.policy_volume is not None
            server.policy_volume.update(new_files)
        else:
            write_files(server.policy_dir, new_files)
        server.wait_for(lambda: version(NEW) in traffic.results[-20:], "new policy served")
        seen_new = len(traffic.results)
        server.wait_for(lambda: len(traffic.results) > seen_new + 50, "more traffic")
    assert traffic.errors == []
    assert set(traffic.results) == {version(OLD), version(NEW)}  # never a mix of the two
    until_every_worker_adopted(server, new_digest)
    ready = server.get("/readyz").json()
    assert ready["status"] == "ready" and ready["policy"]["digest"] == new_digest
    samples = server.metrics()
    assert samples[("runguard_policy_reloads_total", (("result", "success"),))] >= 2
    assert samples[("runguard_policy_rejected", ())] == 0


def test_a_bad_policy_is_rejected_and_the_last_good_one_keeps_serving(
    start_runguard: Any, tmp_path: Path
) -> None:
    server = start_runguard(policy=sample_policy(**OLD), atomic=True)
    assert server.policy_volume is not None
    bad = {**sample_policy(**NEW), "profiles.yaml": BAD_PROFILES}
    with Traffic(server, lambda s: served_version(s, server), max_seconds=40) as traffic:
        server.wait_for(lambda: len(traffic.results) > 20, "traffic")
        server.policy_volume.update(bad)
        server.wait_for(lambda: "rejected" in server.get("/readyz").json(), "rejection")
        seen = len(traffic.results)
        server.wait_for(lambda: len(traffic.results) > seen + 50, "more traffic")
    assert traffic.errors == []
    assert set(traffic.results) == {version(OLD)}

    ready = server.get("/readyz")
    assert ready.status_code == 200  # still serving: a bad edit must not take webhooks down
    body = ready.json()
    assert body["status"] == "degraded"
    assert body["policy"]["digest"] == digest_of(sample_policy(**OLD), tmp_path / "old")
    assert any(re.search(r"profiles\.yaml:6: ", e) for e in body["rejected"]["errors"])
    assert re.search(r"\[ERROR\] runguard\.server:\s+\S*profiles\.yaml:6: ", server.stderr)
    samples = server.metrics()
    assert samples[("runguard_policy_rejected", ())] == 1
    assert samples[("runguard_policy_reloads_total", (("result", "failure"),))] >= 1

    good = sample_policy(**NEW)
    server.policy_volume.update(good)
    server.wait_for(lambda: server.get("/readyz").json()["status"] == "ready", "recovery")
    until_every_worker_adopted(server, digest_of(good, tmp_path / "new"))
    server.wait_for(  # each worker sets its gauge just after it logs the new policy
        lambda: server.metrics()[("runguard_policy_rejected", ())] == 0, "the metric cleared"
    )
    assert served_version(server.session(), server) == version(NEW)


def mutated_pod(session: requests.Session, server: RunguardServer) -> dict[str, Any]:
    """A run Pod as ``/mutate`` leaves it."""
    pod = run_pod()
    resp = session.post(server.url + "/mutate", json=admission_review(pod), timeout=10)
    assert resp.status_code == 200, resp.text
    ops = json.loads(base64.b64decode(resp.json()["response"]["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    return result


def validated(session: requests.Session, server: RunguardServer, pod: Any) -> dict[str, Any]:
    resp = session.post(server.url + "/validate", json=admission_review(pod), timeout=10)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()["response"]
    return answer


def test_a_pod_mutated_just_before_an_edit_is_not_denied_by_the_new_backstop(
    start_runguard: Any, tmp_path: Path
) -> None:
    """The apiserver's /mutate call lands on a worker (or replica) still serving the old
    policy, its /validate call on one serving the new: the Pod the old policy made is
    admitted, saying what the new one would apply; a Pod no /mutate made is not."""
    server = start_runguard(policy=sample_policy(**OLD), atomic=True)
    assert server.policy_volume is not None
    session = server.session()
    made_before = mutated_pod(session, server)
    assert validated(session, server, made_before)["allowed"] is True
    bare = run_pod()
    assert validated(session, server, bare)["allowed"] is False

    new = sample_policy(**NEW)
    new_digest = digest_of(new, tmp_path / "new")
    server.policy_volume.update(new)
    until_every_worker_adopted(server, new_digest)
    ready = server.get("/readyz").json()
    assert ready["policy"]["digest"] == new_digest
    assert ready["previous"]["digest"] == digest_of(sample_policy(**OLD), tmp_path / "old")

    answer = validated(session, server, made_before)
    assert answer["allowed"] is True, answer
    (said,) = [w for w in answer["warnings"] if "replaced a moment ago" in w]
    assert f"the one serving now (digest {new_digest}) would apply" in said
    assert said.endswith("would apply: profile small applied: memory request 2Gi")
    # What the new policy makes passes; what no /mutate made is still denied.
    assert validated(session, server, mutated_pod(session, server))["allowed"] is True
    denied = validated(session, server, bare)
    assert denied["allowed"] is False and "was it bypassed?" in denied["status"]["message"]


def test_a_pod_the_replaced_policy_would_admit_but_no_mutate_here_made_is_denied(
    start_runguard: Any, tmp_path: Path
) -> None:
    """The attack review's chain: within the transition after a reload, an object that
    skipped /mutate was admitted because the replaced policy would have admitted it, even
    when no worker still served that policy. Now only an object a /mutate of this server
    made under the replaced policy is (``webhook.serving.transition``)."""
    server = start_runguard(policy=sample_policy(**OLD), atomic=True)
    assert server.policy_volume is not None
    session = server.session()
    made_here = mutated_pod(session, server)
    (tmp_path / "old").mkdir()
    for name, text in sample_policy(**OLD).items():
        (tmp_path / "old" / name).write_text(text)
    pod = run_pod()
    pod["metadata"]["name"] = "elsewhere"
    pod["spec"]["containers"][0]["image"] = "python:3.12-slim"  # never sent to /mutate
    elsewhere = mutate(pod, load_policy(tmp_path / "old"), namespace="ml").object
    assert validated(session, server, elsewhere)["allowed"] is True  # the old policy's own

    new = sample_policy(**NEW)
    server.policy_volume.update(new)
    until_every_worker_adopted(server, digest_of(new, tmp_path / "new"))
    assert validated(session, server, made_here)["allowed"] is True
    denied = validated(session, server, elsewhere)
    assert denied["allowed"] is False and "was it bypassed?" in denied["status"]["message"]


def test_the_replaced_policy_is_kept_for_a_while_then_forgotten(tmp_path: Path) -> None:
    store = _store(tmp_path, sample_policy(**OLD))
    first = store.current()
    assert first is not None and store.state.recent() is None  # nothing replaced yet
    write_files(tmp_path, sample_policy(**NEW))
    second = store.current()
    assert second is not None and second.digest != first.digest
    assert store.state.recent() is first
    assert store.state.recent(now=store.state.previous_until) is None
    assert store.state.to_dict()["previous"] == {  # type: ignore[comparison-overlap]
        "digest": first.digest,
        "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(store.state.previous_until)),
    }
    write_files(tmp_path, {"profiles.yaml": BAD_PROFILES})
    assert store.current() is second and store.state.recent() is first  # a rejection keeps it
    write_files(tmp_path, sample_policy(**NEW))
    os.utime(tmp_path / "profiles.yaml")
    assert store.current() is not None and store.state.recent() is first  # same digest again


def readyz_answers(server: RunguardServer, connections: int = 24) -> list[dict[str, Any]]:
    """``/readyz`` over fresh connections, each served by whichever worker accepts it."""
    answers = []
    for _ in range(connections):
        with server.session() as session:
            answers.append(server.get("/readyz", session=session).json())
    return answers


def test_a_broken_edit_after_a_good_one_keeps_that_good_one_in_every_worker(
    start_runguard: Any, tmp_path: Path
) -> None:
    """The apiserver keeps one connection alive, to one worker; the others serve nothing
    while a good edit is on disk. When the next edit is broken, every worker serves
    that good edit, not the policy from before it."""
    server = start_runguard(policy=sample_policy(**OLD), workers=2)
    kept_alive = server.session()
    assert served_version(kept_alive, server) == version(OLD)
    write_files(server.policy_dir, sample_policy(**NEW))
    server.wait_for(lambda: served_version(kept_alive, server) == version(NEW), "the good edit")
    good = digest_of(sample_policy(**NEW), tmp_path / "good")

    write_files(server.policy_dir, {"profiles.yaml": BAD_PROFILES})
    server.wait_for(
        lambda: "rejected" in server.get("/readyz", session=kept_alive).json(), "the rejection"
    )
    heard: dict[int, dict[str, Any]] = {}  # the latest /readyz of each worker

    def every_worker_rejecting() -> bool:
        for answer in readyz_answers(server, 4):
            heard[answer["worker"]] = answer
        workers = server.worker_pids()
        return all(pid in heard and "rejected" in heard[pid] for pid in workers)

    server.wait_for(every_worker_rejecting, "every worker reporting the rejection")
    answers = readyz_answers(server)
    assert {answer["status"] for answer in answers} == {"degraded"}
    assert {answer["policy"]["digest"] for answer in answers} == {good}
    assert served_version(kept_alive, server) == version(NEW)
    assert served_version(server.session(), server) == version(NEW)
    # The master loaded the files and logged their errors; the workers only adopted.
    assert len(re.findall(r"\] runguard\.server: policy in \S+ rejected", server.stderr)) == 1
    published = re.search(r"policy decisions published for the workers in (\S+)", server.stderr)
    assert published is not None and Path(published[1]).is_file()
    assert server.stop() == 0
    assert not Path(published[1]).parent.exists()


# ---------------------------------------------------------------- certificates


def rotate(server: RunguardServer, cert: bytes, key: bytes) -> None:
    assert server.cert_volume is not None
    server.cert_volume.update({"tls.crt": cert, "tls.key": key})


def test_a_renewed_certificate_is_served_while_requests_flow(start_runguard: Any) -> None:
    server = start_runguard(policy=sample_policy(), atomic=True)
    assert peer_certificate("127.0.0.1", server.port, server.ca_file).serial_number == server.serial
    cert, key, serial = server.ca.issue(days=30)
    kept_alive = server.session()
    assert served_version(kept_alive, server)
    with (
        Traffic(server, lambda s: served_version(s, server), threads=2) as alive,
        Traffic(server, lambda s: served_version(s, server), threads=2, fresh=True) as fresh,
    ):
        server.wait_for(lambda: len(alive.results) > 20 and len(fresh.results) > 5, "traffic")
        rotate(server, cert, key)
        server.wait_for(
            lambda: (
                peer_certificate("127.0.0.1", server.port, server.ca_file).serial_number == serial
            ),
            "the new certificate on new connections",
        )
        count = fresh.count
        server.wait_for(lambda: fresh.count > count + 20, "more traffic")
    assert alive.errors == [] and fresh.errors == []
    assert served_version(kept_alive, server)  # a connection opened before still works
    renewed = x509.load_pem_x509_certificate(cert).not_valid_after_utc.timestamp()

    def expiry_published() -> bool:  # by each worker once it made a new connection
        served_version(server.session(), server)
        samples = server.metrics()
        return samples[("runguard_certificate_expiry_timestamp_seconds", ())] == renewed

    server.wait_for(expiry_published, "the renewed certificate's expiry in the metrics")


def test_a_broken_certificate_pair_keeps_the_previous_one(start_runguard: Any) -> None:
    server = start_runguard(policy=sample_policy(), atomic=True)
    _, old_key_mismatch, _ = server.ca.issue()
    cert, key, serial = server.ca.issue()
    rotate(server, cert, old_key_mismatch)  # a certificate with someone else's key

    def logged() -> bool:
        peer_certificate("127.0.0.1", server.port, server.ca_file)  # a new connection checks
        return "not reloaded, keeping the previous one" in server.stderr

    server.wait_for(logged, "the error logged")
    for _ in range(3):
        assert served_version(server.session(), server)
        assert peer_certificate("127.0.0.1", server.port, server.ca_file).serial_number == (
            server.serial
        )
    rotate(server, cert, key)
    server.wait_for(
        lambda: peer_certificate("127.0.0.1", server.port, server.ca_file).serial_number == serial,
        "the fixed pair",
    )


# ----------------------------------------------------------- units of the store


def test_a_configmap_swap_changes_the_directory_signature(tmp_path: Path) -> None:
    volume = AtomicDir(tmp_path / "cm", sample_policy(**OLD))
    before = directory_signature(volume.path)
    assert directory_signature(volume.path) == before
    volume.update(sample_policy(**OLD))  # same content, new ..data target
    assert directory_signature(volume.path) != before


def _store(directory: Path, files: dict[str, str], **options: Any) -> PolicyStore:
    directory.mkdir(exist_ok=True)
    write_files(directory, files)
    store = PolicyStore(directory, interval=0, settle=0, **options)
    store.load()
    return store


def test_policy_store_swaps_in_a_good_policy_and_keeps_it_on_a_bad_one(tmp_path: Path) -> None:
    events: list[tuple[bool | None, PolicyState]] = []
    store = _store(tmp_path, sample_policy(**OLD), observer=lambda s, r: events.append((r, s)))
    first = store.current()
    assert first is not None and first.first.name == "http-test"
    assert events == [(None, store.state)]  # the state this process starts with

    write_files(tmp_path, sample_policy(**NEW))
    second = store.current()
    assert second is not None and second.digest != first.digest
    assert events[-1][0] is True and not store.state.rejected

    write_files(tmp_path, {"profiles.yaml": BAD_PROFILES})
    assert store.current() is second  # the last good one
    assert events[-1][0] is False
    assert store.state.rejected and "profiles.yaml:6: " in store.state.rejected[0]
    detail = store.state.to_dict()
    assert detail["rejected"]["errors"] == list(store.state.rejected)  # type: ignore[index]

    count = len(events)
    assert store.current() is second
    assert len(events) == count  # the same bad files are not loaded (and logged) again


def test_followers_serve_the_published_decision_even_after_sitting_out_a_good_edit(
    tmp_path: Path,
) -> None:
    master = _store(tmp_path / "policy", sample_policy(**OLD))
    publication = PolicyPublication(tmp_path / "published")
    publication.directory.mkdir()
    master.publish(publication, watch=False)

    def never(directory: Path) -> Any:
        raise AssertionError(f"a follower loaded {directory}")

    events: list[tuple[bool | None, PolicyState]] = []
    busy, idle = (
        PolicyStore(
            master.directory, never, interval=0, observer=lambda s, r: events.append((r, s))
        )
        for _ in range(2)
    )
    busy.follow(publication, watch=False)
    idle.follow(publication, watch=False)
    old = master.state.policy
    assert old is not None and busy.current() == old and idle.state.policy == old

    write_files(master.directory, sample_policy(**NEW))
    master.refresh()
    good = busy.current()
    assert good is not None and good.digest != old.digest  # the idle one saw nothing

    write_files(master.directory, {"profiles.yaml": BAD_PROFILES})
    master.refresh()
    served = idle.current()
    assert served is not None and served.digest == good.digest
    assert idle.state.rejected == master.state.rejected != ()
    assert "profiles.yaml:6: " in idle.state.rejected[0]
    assert idle.state.loaded_at == busy.state.loaded_at == master.state.loaded_at
    assert busy.current() is good  # the same policy: the object in use stays
    assert busy.state.rejected == master.state.rejected
    assert [r for r, _ in events] == [None, None, True, False, False]

    count = len(events)
    master.refresh()
    assert idle.current() is served and len(events) == count  # nothing new published
    master.stop()
    assert not publication.directory.exists()


def test_policy_store_waits_for_files_to_settle(tmp_path: Path) -> None:
    store = _store(tmp_path, sample_policy(**OLD))
    store.settle = 3600.0
    first = store.current()
    write_files(tmp_path, sample_policy(**NEW))
    assert store.current() is first  # just written: maybe half copied
    old = time.time() - 7200
    for name in sample_policy():
        os.utime(tmp_path / name, (old, old))
    assert store.current() is not first


def test_policy_store_checks_at_most_once_per_interval(tmp_path: Path) -> None:
    store = _store(tmp_path, sample_policy(**OLD))
    store.interval = 3600.0
    first = store.current()
    write_files(tmp_path, sample_policy(**NEW))
    assert store.current() is first
    assert store.refresh().policy is not first  # an explicit refresh looks now


def test_policy_store_first_load_raises_every_issue(tmp_path: Path) -> None:
    write_files(tmp_path, {**sample_policy(), "profiles.yaml": BAD_PROFILES})
    with pytest.raises(PolicyError) as caught:
        PolicyStore(tmp_path).load()
    assert "profiles.yaml:6: " in str(caught.value.errors[0])


# --------------------------------------------------------------- serve settings


def test_serve_settings_come_from_flags_then_environment(tmp_path: Path) -> None:
    (tmp_path / "c").write_text("x")
    (tmp_path / "k").write_text("x")
    env = {
        "RUNGUARD_POLICY_DIR": str(tmp_path),
        "RUNGUARD_CERT_FILE": str(tmp_path / "c"),
        "RUNGUARD_KEY_FILE": str(tmp_path / "k"),
        "RUNGUARD_BIND": "0.0.0.0:9443",
        "RUNGUARD_WORKERS": "3",
        "RUNGUARD_MAX_BODY": "1Mi",
    }
    settings = ServeSettings.resolve({"workers": "5"}, env)
    assert settings.bind == "0.0.0.0:9443" and settings.workers == 5
    assert settings.max_body == 1024 * 1024 and settings.policy_dir == tmp_path
    with pytest.raises(SettingsError, match="RUNGUARD_CERT_FILE"):
        ServeSettings.resolve({}, {"RUNGUARD_POLICY_DIR": str(tmp_path)})
    with pytest.raises(SettingsError, match="workers"):
        ServeSettings.resolve({"workers": "0"}, env)


@pytest.mark.parametrize(
    ("text", "size"), [("4194304", 4194304), ("4Mi", 4194304), ("512Ki", 524288), ("2M", 2e6)]
)
def test_byte_size(text: str, size: int) -> None:
    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "4Gi", "-1", "10"])
def test_byte_size_refuses_nonsense(text: str) -> None:
    with pytest.raises(SettingsError):
        byte_size(text)


def test_plain_gunicorn_with_a_bad_policy_is_unready_until_it_is_fixed(
    start_runguard: Any, tmp_path: Path
) -> None:
    """``runguard serve`` refuses to start on a bad policy; a plain gunicorn with
    gunicorn.conf.py (the container) stays up, unready, and recovers by itself."""
    bad = {**sample_policy(**OLD), "profiles.yaml": BAD_PROFILES}
    server = start_runguard(policy=bad, gunicorn_conf=True, atomic=True)
    ready = server.get("/readyz")
    assert ready.status_code == 503
    assert any("profiles.yaml:6: " in e for e in ready.json()["rejected"]["errors"])
    resp = server.post("/mutate", admission_review(run_pod()))
    assert resp.status_code == 503 and resp.json()["error"] == "Unavailable"
    assert server.policy_volume is not None
    server.policy_volume.update(sample_policy(**NEW))
    # Every worker, not just the one behind the keep-alive connection /readyz used.
    until_every_worker_adopted(server, digest_of(sample_policy(**NEW), tmp_path / "new"))
    assert server.get("/readyz").status_code == 200
    assert served_version(server.session(), server) == version(NEW)
