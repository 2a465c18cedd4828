"""Admission: an AdmissionReview in, its answer out (admit.py asks the questions, envelope.py
reads the review and writes the answer; recent.py keeps the latest answers for the topology page)."""
from .admit import review
from .envelope import OUTCOMES, AdmissionOutcome, AdmissionResult, MalformedReview, make_review

__all__ = ["OUTCOMES", "AdmissionOutcome", "AdmissionResult", "MalformedReview", "make_review", "review"]
