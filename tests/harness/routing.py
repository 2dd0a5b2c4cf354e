"""The apiserver's side of a webhook call: ``Cel`` evaluates matchConditions, ``calls`` tells
which webhooks of a configuration a request reaches (rules, selectors, conditions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from webhook.engine.context import Requester


class Cel:
    """Evaluates matchConditions as the apiserver does: all must hold, none may fail."""

    def __init__(self) -> None:
        cel = pytest.importorskip("cel_expr_python.cel")
        optional = pytest.importorskip("cel_expr_python.ext.ext_optional")
        strings = pytest.importorskip("cel_expr_python.ext.ext_strings")
        self.cel = cel
        self.env = cel.NewEnv(
            variables={"object": cel.Type.DYN, "oldObject": cel.Type.DYN,
                       "request": cel.Type.DYN},
            extensions=[optional.ExtOptional(), strings.ExtStrings()],
        )  # fmt: skip
        self.programs: dict[str, Any] = {}

    def holds(self, expression: str, obj: dict[str, Any], resource: str) -> bool:
        if expression not in self.programs:
            self.programs[expression] = self.env.compile(expression)
        request = {"operation": "CREATE", "resource": {"resource": resource}}
        value = self.programs[expression].eval(
            data={"object": obj, "oldObject": None, "request": request}
        )
        # An error would fail the request (failurePolicy Fail): never expected here.
        assert value.type() == self.cel.Type.BOOL, (expression, obj)
        return bool(value.value())

    def routed(self, hook: dict[str, Any], obj: dict[str, Any], resource: str) -> bool:
        return all(self.holds(c["expression"], obj, resource) for c in hook["matchConditions"])


RESOURCES = {
    "Pod": ("", "pods"),
    "Job": ("batch", "jobs"),
    "CronJob": ("batch", "cronjobs"),
    "Deployment": ("apps", "deployments"),
    "Workflow": ("argoproj.io", "workflows"),  # an operator's kind (the Core's Argo)
    "RayJob": ("ray.io", "rayjobs"),  # an operator's kind with pod templates (KubeRay's)
}


def holds(cel: Cel, expression: str, data: dict[str, Any]) -> bool:
    """A matchCondition on this request's data (``object``, ``oldObject``, ``request``)."""
    if expression not in cel.programs:
        cel.programs[expression] = cel.env.compile(expression)
    value = cel.programs[expression].eval(data=data)
    # An error fails the request (failurePolicy Fail): the conditions never raise one.
    assert value.type() == cel.cel.Type.BOOL, (expression, data, value)
    return bool(value.value())


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector, read from the rendered dict (not the engine's model)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or ():
        present, values = e["key"] in labels, e.get("values") or []
        held = {
            "In": present and labels.get(e["key"]) in values,
            "NotIn": not (present and labels.get(e["key"]) in values),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not held:
            return False
    return True


def _labels(obj: Any) -> dict[str, str]:
    if not isinstance(obj, dict):
        return {}
    return dict((obj.get("metadata") or {}).get("labels") or {})


def calls(
    cel: Cel, configuration: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None,
    namespace: str, operation: str, who: Requester, subresource: str = "",
) -> list[str]:  # fmt: skip
    """The webhooks of ``configuration`` the apiserver calls for this request."""
    group, resource = RESOURCES[obj["kind"]]
    routed = f"{resource}/{subresource}" if subresource else resource
    request: dict[str, Any] = {
        "operation": operation,
        "namespace": namespace,
        "name": obj["metadata"]["name"],
        "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "userInfo": {"username": who.username, "groups": list(who.groups)},
    }
    if subresource:
        request["subResource"] = subresource
    data = {"object": obj, "oldObject": old, "request": request}
    out = []
    for hook in configuration["webhooks"]:
        if not any(
            group in rule["apiGroups"]
            and operation in rule["operations"]
            and routed in rule["resources"]
            for rule in hook["rules"]
        ):
            continue
        if not selector_matches(hook["namespaceSelector"],
                                {"kubernetes.io/metadata.name": namespace}):  # fmt: skip
            continue
        selector = hook.get("objectSelector")
        if selector is not None and not (
            selector_matches(selector, _labels(obj))
            or (old is not None and selector_matches(selector, _labels(old)))
        ):
            continue
        if all(holds(cel, c["expression"], data) for c in hook.get("matchConditions") or ()):
            out.append(hook["name"])
    return out
