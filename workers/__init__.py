"""Polar's Celery workers: ``celery -A workers worker -Q <stage>``. A thin shell over ``polar.stages``."""

from workers import callbacks, reconciler, stages
from workers.app import celery_app

__all__ = ["callbacks", "celery_app", "reconciler", "stages"]
