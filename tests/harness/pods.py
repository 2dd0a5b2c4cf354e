"""A ``Pod`` (``webhook.engine.pod``) built for a unit test of one rules module: a
policy written from plain dicts, and the pod spec a rule step or check is called on
directly, with nothing else of the engine around it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from webhook.engine.context import NO_CONTEXT, OWNERSHIP_OFF, Context, Ownership
from webhook.engine.pod import Pod
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

JSON = dict[str, Any]
SELECTED = {"app": "run"}  # the labels every test policy selects
NOT_PLATFORM = Ownership(False)  # a run the platform did not create


def policy_of(
    directory: Path,
    spec: Mapping[str, Any] | None = None,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
) -> Policy:
    """The policy of one RunPolicy, ``test``, selecting ``app: run`` with ``spec`` (its
    other keys), and a Profile per entry of ``profiles`` (name -> spec), written to
    ``directory`` and loaded."""
    run_spec = {"selector": {"matchLabels": dict(SELECTED)}, **(spec or {})}
    documents: list[JSON] = [
        {"apiVersion": "runguard.io/v1", "kind": "RunPolicy",
         "metadata": {"name": "test"}, "spec": run_spec},
    ]  # fmt: skip
    for name, profile in (profiles or {}).items():
        documents.append(
            {"apiVersion": "runguard.io/v1", "kind": "Profile",
             "metadata": {"name": name}, "spec": dict(profile)}
        )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump_all(documents, sort_keys=False)
    (directory / "policy.yaml").write_text(text, encoding="utf-8")
    return load_policy(directory)


def container(name: str = "main", **fields: Any) -> JSON:
    """A container of ``name`` with an image, and ``fields``."""
    return {"name": name, "image": "python:3.12", **fields}


def pod_of(
    policy: Policy,
    spec: Mapping[str, Any] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ownership: Ownership = OWNERSHIP_OFF,
    context: Context = NO_CONTEXT,
    **fields: Any,
) -> Pod:
    """A ``Pod`` of ``spec`` (copied; one ``main`` container when None) under ``policy``,
    labelled ``app: run`` plus ``labels``, judged by its first RunPolicy; ``fields`` are
    Pod's other fields."""
    body = copy.deepcopy(dict(spec)) if spec is not None else {"containers": [container()]}
    return Pod(
        body,
        {**SELECTED, **(labels or {})},
        dict(annotations or {}),
        policy.first,
        ownership=ownership,
        context=context,
        **fields,
    )
