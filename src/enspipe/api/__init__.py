"""The library layer: what a member's own training script calls (:class:`SharedStream`)."""
