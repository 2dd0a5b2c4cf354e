"""Reading what users hand runguard: YAML/JSON documents, Kubernetes quantities,
kubeconfigs.
"""
