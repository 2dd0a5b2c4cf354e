"""End-to-end tests: runguard behind a real kube-apiserver (see docs/dev/e2e.md)."""
