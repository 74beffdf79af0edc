"""Plumbing every layer may use and that knows nothing of enspipe: atomic file writes, the
per-rank JSON-lines event log, and dying with the launcher."""
