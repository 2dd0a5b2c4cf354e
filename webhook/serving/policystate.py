"""What the serving policy is, and the gunicorn master's decision about it in one file
its workers read (``webhook.serving.policystore`` decides and follows; the process model is
described there)."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from webhook.policy.model import Policy
from webhook.serving.watch import Signature, file_signature, stat_signature

__all__ = ["TRANSITION", "PolicyPublication", "PolicyState", "iso_time"]

# How long the replaced policy is kept for ``webhook.serving.transition``: replicas reading one
# ConfigMap see an edit up to the kubelet's sync period (about a minute) apart.
TRANSITION = 120.0


@dataclass(frozen=True)
class PolicyState:
    """What a store serves, and what it thinks of the files on disk.

    ``rejected`` holds the ``file:line`` errors of the files on disk when they failed
    to load (the last good ``policy`` keeps serving); it is empty when the files on
    disk are the ones serving.
    """

    policy: Policy | None
    signature: Signature = ()
    loaded_at: float = 0.0  # unix time the serving policy was loaded
    rejected: tuple[str, ...] = ()
    rejected_at: float = 0.0
    # The good policy this one replaced, for ``TRANSITION`` seconds (unix time ``until``):
    # a Pod its ``/mutate`` made, in a worker or replica that had not swapped yet, is
    # not denied by the new one's backstop (``webhook.serving.transition``).
    previous: Policy | None = None
    previous_until: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """The ``/readyz`` detail."""
        out: dict[str, object] = {}
        if self.policy is not None:
            out["policy"] = {
                "name": self.policy.first.name,  # the first tried, as before several existed
                "runPolicies": self.policy.names(),
                "digest": self.policy.digest,
                "loadedAt": iso_time(self.loaded_at),
                "profiles": self.policy.profile_names(),
            }
        if self.rejected:
            out["rejected"] = {"at": iso_time(self.rejected_at), "errors": list(self.rejected)}
        if self.previous is not None and time.time() < self.previous_until:
            out["previous"] = {
                "digest": self.previous.digest,
                "until": iso_time(self.previous_until),
            }
        return out

    def recent(self, now: float | None = None) -> Policy | None:
        """The policy this one replaced, while its ``/mutate`` may still be answering
        somewhere (another worker, another replica); None after that."""
        if self.previous is None or (time.time() if now is None else now) >= self.previous_until:
            return None
        return self.previous


def iso_time(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


class PolicyPublication:
    """The gunicorn master's decision, in one file its workers read: the ``PolicyState``
    to serve (the last good policy, and the errors of the files on disk if rejected).

    Written whole to a temporary file renamed over the previous one, so a reader gets
    one decision or the next, never a mix. A pickle: written by the master and read by
    its own forks, in a directory only this user can enter (``mkdtemp`` makes it 0700).
    """

    FILE = "state.pickle"

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.FILE
        self._owner = os.getpid()

    @classmethod
    def create(cls, parent: str | None = None) -> PolicyPublication:
        """A publication in a fresh private directory in ``parent`` (by default the
        temporary directory), removed by ``remove()``."""
        return cls(tempfile.mkdtemp(prefix="runguard-policy-", dir=parent))

    def write(self, state: PolicyState) -> None:
        tmp = self.path.with_name(f".{self.FILE}.tmp")
        tmp.write_bytes(pickle.dumps(replace(state, signature=()), pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, self.path)

    def signature(self) -> tuple[object, ...]:
        return file_signature(self.path)

    def read(self) -> tuple[tuple[object, ...], PolicyState]:
        """The published state, with the ``signature()`` of the very file it came from."""
        with open(self.path, "rb") as file:
            signature = stat_signature(self.path, os.fstat(file.fileno()))
            state = pickle.load(file)
        if not isinstance(state, PolicyState):
            raise TypeError(f"{self.path} holds a {type(state).__name__}, not a PolicyState")
        return signature, state

    def remove(self) -> None:
        """Remove the directory ``create()`` made, in the process that made it."""
        if os.getpid() == self._owner:
            shutil.rmtree(self.directory, ignore_errors=True)
