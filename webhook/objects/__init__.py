"""Kubernetes objects in and out: workload kinds, templates, groups, mutation, JSON patch, AdmissionReview."""
