"""End-to-end tests: runguard behind a real kube-apiserver (see docs/e2e.md)."""
