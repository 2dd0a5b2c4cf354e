"""The admission server: Flask app, AdmissionReview plumbing, gunicorn, TLS, policy
reload, the doors into running Pods, logs and metrics.
"""
