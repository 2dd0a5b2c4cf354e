"""The OpenReports CRDs runguard's reports are held to: ``tests/openreports/``,
reports-api v0.2.1's ``config/crd`` verbatim (the e2e tests install the same files from
the Go module cache and check they are these), and each one's served schema."""

from __future__ import annotations

from typing import Any

import yaml

from webhook.audit.openreports import OPEN_REPORTS

from .inputs import TESTS

CRDS = TESTS / "openreports"


def crd(name: str) -> dict[str, Any]:
    """The CRD of ``openreports.io_<name>.yaml``: ``reports`` or ``clusterreports``."""
    loaded: dict[str, Any] = yaml.safe_load((CRDS / f"openreports.io_{name}.yaml").read_text())
    return loaded


def schema(definition: dict[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of the version runguard writes (served and stored)."""
    (version,) = [v for v in definition["spec"]["versions"] if v["name"] == OPEN_REPORTS.version]
    assert version["served"] and version["storage"]
    found: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return found
