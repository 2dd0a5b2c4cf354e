"""Offline judgment: the runs already in a cluster (`runguard audit`), the doors only
RBAC can close (`audit --rbac`), declarative cases (`runguard test`), one run explained
(`runguard explain`) and the runs under a proposed policy (`runguard whatif`).
"""
