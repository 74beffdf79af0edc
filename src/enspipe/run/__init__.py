"""The member program: placement and pinning, the staged pipeline, the consumers, calibration,
and the per-rank main loop with its summary (``member``)."""
