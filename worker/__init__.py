"""Warm-up workers: claim tasks, rehearse them, upload artifacts (see worker.loop)."""
