"""What installs runguard: the webhook configurations and CRDs rendered from the policy,
the Helm chart, the certificates.
"""
