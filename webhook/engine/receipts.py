"""Receipts: what ``mutate`` leaves for ``validate`` so the backstop is not run twice.

``validate``'s backstop (``backstop.not_mutated``) denies a Pod created past ``/mutate``:
it runs every mutation step on a copy of the Pod and compares. For a Pod that ``mutate``
itself produced that comparison has one possible answer: mutation is idempotent (the
apiserver's ``reinvocationPolicy: IfNeeded`` relies on it, and
``tests/engine/test_properties.py`` and ``tests/engine/test_receipts.py`` check it), so running
the steps again on their own result changes nothing. A receipt records that answer, and
``validate`` skips the steps when it holds one for exactly the inputs it would give them.

A receipt is a key, nothing else: a 32-byte BLAKE2b digest of every input of the
mutation steps as ``validate`` builds them (``Pod``'s fields: the pod spec, labels,
annotations, claim templates, where the spec is, the namespace, whether the platform
created the run, the owner references), the governing RunPolicy (its name and the digest
of its source documents), who asks (user name and groups), the operation and
subresource, and the version of the cluster view the steps read. So:

- it cannot be forged: only ``mutate`` adds keys, each for the object it returned; a
  client sends objects, never keys, and an object that differs from what ``mutate``
  returned in any input (another spec, another label, a bypassed ``/mutate``) has
  another key, whose lookup misses, and the backstop runs as before;
- it cannot be replayed across users, namespaces, RunPolicies or cluster state: each is
  in the key, so the same Pod sent by another user, in another namespace, under an
  edited policy or after any change of the cluster view is a miss;
- a miss (a receipt overwritten, another replica or worker without a shared table, a
  field that cannot be encoded exactly) only costs the backstop's time: nothing is ever
  allowed on a receipt that the steps would not allow.

Nothing else of ``validate`` is skipped: its checks and the trust checks run on every
object. The server keeps one ``SharedReceipts`` table mapped by every gunicorn worker
(``webhook/serving/admission.py``); ``evaluate`` passes a ``LocalReceipts`` from its ``mutate``
to its ``validate``.
"""

from __future__ import annotations

import hashlib
import mmap
from collections import OrderedDict
from dataclasses import fields
from operator import attrgetter
from typing import Any, Protocol

import orjson

from webhook.engine.context import Context, Ownership, Requester
from webhook.engine.pod import Pod

KEY_SIZE = 32
_PERSON = b"rg-backstop-v1"  # a new key layout takes a new personalization
# Every input of a ``Pod`` and of its ``Context`` (a field added to either is in the key),
# but the policy and the cluster view, which go in as their digest and version.
# The policies enter the key by name and digest (``root``, every RunPolicy, by its digest).
_POD_FIELDS = tuple(
    f.name for f in fields(Pod) if f.init and f.name not in ("policy", "context", "root")
)
_CONTEXT_FIELDS = tuple(f.name for f in fields(Context) if f.name != "state")


class Receipts(Protocol):
    """Where ``mutate`` leaves receipts and ``validate`` looks them up."""

    def add(self, key: bytes) -> None: ...
    def __contains__(self, key: object) -> bool: ...


class LocalReceipts:
    """Receipts in this process (``evaluate``, tests), the last ``size`` kept."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def add(self, key: bytes) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class SharedReceipts:
    """A fixed table of keys in anonymous shared memory, made before the workers fork
    (the server preloads the app), so ``/validate`` finds what ``/mutate`` left in any
    worker of this process tree. A key goes into the slot its first bytes name; a newer
    key overwrites an older one (a miss, never a wrong hit). Two workers writing one slot
    at once may leave a mix of both keys, which matches no key but with the chance of a
    128-bit collision: a miss."""

    def __init__(self, slots: int = 8192) -> None:
        self._slots = slots
        self._table = mmap.mmap(-1, slots * KEY_SIZE)  # MAP_SHARED | MAP_ANONYMOUS

    def _offset(self, key: bytes) -> int:
        return (int.from_bytes(key[:8], "little") % self._slots) * KEY_SIZE

    def add(self, key: bytes) -> None:
        if len(key) == KEY_SIZE:
            at = self._offset(key)
            self._table[at : at + KEY_SIZE] = key

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or len(key) != KEY_SIZE:
            return False
        at = self._offset(key)
        return self._table[at : at + KEY_SIZE] == key


def state_version(context: Context) -> str | None:
    """The cluster view's version ("" without a view); None when the view has none."""
    state = context.state
    if state is None:
        return ""
    version = getattr(state, "version", None)
    if version is None:
        return None
    value = version()
    return value if isinstance(value, str) and value else None


# JSON as the apiserver sends it, encoded one way: keys sorted; orjson refuses what it
# cannot encode exactly (non-string keys, integers past 64 bits), and dataclasses and
# dates go to ``_record``, which takes only runguard's own records (``_RECORDS``).
_EXACT = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


# The dataclasses a key may hold, each as the list of its fields' values; where they are
_RECORDS = {cls: attrgetter(*(f.name for f in fields(cls))) for cls in (Ownership, Requester)}
_POD_INPUTS = attrgetter(*_POD_FIELDS)
_POD_INDEX = {name: i for i, name in enumerate(_POD_FIELDS)}
_CONTEXT_INPUTS = attrgetter(*_CONTEXT_FIELDS)


def _record(value: Any) -> Any:
    fields_of = _RECORDS.get(type(value))
    if fields_of is None:
        raise TypeError(type(value).__name__)
    return list(fields_of(value))


def backstop_key(pod: Pod, since: str | None = None, **fields_now: Any) -> bytes | None:
    """The receipt key of the mutation steps' inputs, as ``pod`` holds them (but those
    in ``fields_now``); None when an input cannot be encoded exactly (such a Pod never
    has a receipt), or when the cluster view's version is no longer ``since`` (it moved
    while the steps ran)."""
    policy, context = pod.policy, pod.context
    version = state_version(context)
    if version is None or not policy.digest or (since is not None and version != since):
        return None
    values = list(_POD_INPUTS(pod))
    for name, value in fields_now.items():
        values[_POD_INDEX[name]] = value
    root = pod.root.digest if pod.root is not None else None
    inputs: list[Any] = [
        policy.name,
        policy.digest,
        root,
        version,
        *_CONTEXT_INPUTS(context),
        *values,
    ]
    for i, value in enumerate(inputs):  # runguard's records, here rather than through orjson
        if type(value) in _RECORDS:
            inputs[i] = _record(value)
    try:
        encoded = orjson.dumps(inputs, default=_record, option=_EXACT)
    except (orjson.JSONEncodeError, TypeError):
        return None
    return hashlib.blake2b(encoded, digest_size=KEY_SIZE, person=_PERSON).digest()


def made_key(policy_digest: str, obj: Any) -> bytes | None:
    """The key ``/mutate`` leaves for the object it returned under the policy of digest
    ``policy_digest`` (its kind, namespace and spec), for ``webhook.serving.transition``:
    a worker of this server that still served that policy made this object. None when the
    object cannot be encoded exactly (it never has such a key)."""
    if not isinstance(obj, dict):
        return None
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    try:
        text = orjson.dumps(
            ["made", policy_digest, obj.get("kind"), namespace, obj.get("spec")], option=_EXACT
        )
    except TypeError:
        return None
    return hashlib.blake2b(text, digest_size=KEY_SIZE).digest()


def leave_made(receipts: Receipts, policy_digest: str, obj: Any) -> None:
    """Leave ``made_key`` of the object ``/mutate`` returned, when it has one."""
    key = made_key(policy_digest, obj)
    if key is not None:
        receipts.add(key)
