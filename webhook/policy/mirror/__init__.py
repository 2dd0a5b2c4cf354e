"""Policy objects (RunPolicy, Platform and Profile custom resources) served live: the
checks of ``/validate-policy``, the mirror into the policy directory and each object's
``Loaded`` condition (``objects``), the watch that keeps the mirror (``watch``) and its
process as the server runs it (``process``)."""
