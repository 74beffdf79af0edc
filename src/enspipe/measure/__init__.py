"""Measuring: node CPU (mpstat, or the psutil sampler where sysstat is missing), per-thread CPU,
the pipeline stages' CPU and wall time, power and energy readers, and the node monitor."""
