"""Every label and annotation key runguard writes or reads as its own, declared once.

The records runguard writes on an object at CREATE and puts back on every UPDATE (see
``webhook.engine.rules.ownership``), the keys an admin may change in the policy (their
defaults here), and the labels of what runguard itself creates. Nothing else in
``webhook/`` spells a ``runguard.io/`` key (``tests/test_structure.py``).
"""

from __future__ import annotations

__all__ = [
    "MAIN_CONTAINER_ANNOTATION",
    "PLATFORM_POLICY",
    "PLATFORM_RECORD",
    "POLICY_LABEL",
    "PREEMPTION_MODE_ANNOTATION",
    "PROFILE_LABEL",
    "REPORT_LABEL",
    "REQUESTED_BY",
    "SIZE_RECORD",
]

# Who created a run Pod, controller or operator object (the stamp), set at CREATE.
REQUESTED_BY = "runguard.io/requested-by"
# "true" when the object's creator was the platform (a platform identity, or one of its
# controllers acting for an object that was the platform's): decided from the CREATE
# request and its controller owner then, written by runguard, never changed after.
PLATFORM_RECORD = "runguard.io/platform"
# The RunPolicy whose platform wrote ``PLATFORM_RECORD`` (its name), written and kept
# with it: with two platforms in a cluster, whose record it is. A record without it was
# written by a version before it (read as ``scope.recorder`` says).
PLATFORM_POLICY = "runguard.io/platform-policy"
# The RunPolicy that governs the object, chosen at CREATE and fixed for its life (a label,
# so that the webhooks' objectSelector can route by it). Also on each PolicyReport
# ``runguard audit`` writes: the RunPolicy whose runs it lists.
POLICY_LABEL = "runguard.io/policy"
# What a run's pod template was sized at when runguard applied its profile at CREATE (the
# profile, its digest and the main container's resources, JSON): the Pods made from the
# template copy it and are judged against it, never re-sized from a profile edited since.
SIZE_RECORD = "runguard.io/size"
# A run's annotation naming its main container, when a profile's sidecars leave a choice.
MAIN_CONTAINER_ANNOTATION = "runguard.io/main-container"
# The defaults of ``profiles.label`` and ``scheduling.preemption.annotation``.
PROFILE_LABEL = "runguard.io/profile"
PREEMPTION_MODE_ANNOTATION = "runguard.io/preemption-mode"
# On the reports ``runguard audit --rbac`` writes (PolicyReports, OpenReports): which
# report it is.
REPORT_LABEL = "runguard.io/report"
