"""The attach server: one node's preprocessing served to processes that attach at any time (``enspipe serve``)."""
