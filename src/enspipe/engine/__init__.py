"""The pipeline engine below the stream, the cell and the server: read → decode → augment →
batch (:mod:`enspipe.engine.pipeline`), on a backend from one registry
(:mod:`enspipe.engine.backends`), its CPU work on the member's cores (:mod:`enspipe.engine.affinity`,
:mod:`enspipe.engine.placement`) and, on the CPU backends, in worker processes
(:mod:`enspipe.engine.workers`)."""
