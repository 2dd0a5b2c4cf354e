"""The watch processes the server starts (each a fresh interpreter, ``python -m``):
``clusterstate`` keeps the cluster state's publication, ``policy`` mirrors the policy
objects into the policy directory. Their programs live here, above the layers they
drive (the policy, the cluster state, the rendered webhooks, the server's log), so that
no lower layer imports the server's or the installer's modules.
"""
