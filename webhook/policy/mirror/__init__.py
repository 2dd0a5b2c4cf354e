"""Policy objects (RunPolicy, Platform and Profile custom resources) served live: the
checks of ``/validate-policy``, the mirror into the policy directory and each object's
``Loaded`` condition (``objects``), and the watch's
process as the server runs it (``process``); the watch that keeps the mirror is
``webhook.watches.policy``, a program above the installer it renders routing with."""
