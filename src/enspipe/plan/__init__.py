"""What to run: the scheme registry and its plans, the validated run configuration, and the
experiment grid of cells. Nothing here runs MPI or TensorFlow."""
