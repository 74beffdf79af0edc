"""Every event a rank logs and every key of a cell's ``summary.json``, declared once with what it
holds (as MLPerf logging's constants module does).

Writers log events by these names (:class:`enspipe.common.events.EventLog` refuses any other),
readers filter by them; ``tests/test_run.py`` holds a real run's summary and rank reports to
:data:`SUMMARY` and :data:`RANK`, and the results table's reads to them.
"""
from __future__ import annotations

# -- events: one JSON line each in events.rankNNNN.jsonl, with "event", "t" (Unix s) and "rank" ----
CONFIG = "config"
STEP = "step"
OCCUPANCY = "occupancy"
EXCHANGE_PATH = "exchange_path"
MEASURE_START = "measure_start"
MEASURE_END = "measure_end"
STOPPED = "stopped"
EPOCH = "epoch"
SKIPPED = "skipped"
SERVICE = "service"
MEMBER_EPOCH = "member_epoch"
END = "end"
DECODES = "decodes"

EVENTS: dict[str, str] = {
    CONFIG: "first record: the run's configuration, scheme, role, placement, share and dataset",
    EXCHANGE_PATH: "how a communicator group exchanges: node-shm, node-shm+mpi or mpi (and why)",
    OCCUPANCY: "queue occupancy samples of the pipeline's stage queues (the paper's Fig. 3)",
    STEP: "one consumed batch: step, measured or not, times, queue depths, ids (and checksum, loss; a data-parallel "
          "rank's gradient exchange: its bytes and, in blocks, when each was posted and summed)",
    MEASURE_START: "the measured window opens at this step (whether warm-up reached the steady state; the steps"
                   " run after the agreement to drain what its wait stocked)",
    MEASURE_END: "the measured window closes at this step",
    STOPPED: "the producers stopped together; batches made beyond the window and discarded",
    EPOCH: "one completed epoch: count, order-independent digest, missing samples",
    SKIPPED: "a corrupt record or undecodable image skipped under --on-corrupt skip",
    SERVICE: "tfdata_service: the dispatcher's address, the dataset id, the workers, this member's worker and cache",
    MEMBER_EPOCH: "--member-epochs: the member trained another epoch: its epochs so far, validation loss, whether "
                  "it converged (early stopping), the checkpoint written, the step from which it idles",
    END: "the rank is done (with the failure, if an epoch came up short)",
    DECODES: "the preprocess stage's decodes at its end: the gpu backend's on its device and on the CPU (those "
             "nvJPEG refused), the pillow backend's images decoded whole for a crop, by reason",
}

# -- summary.json: the cell, written by rank 0 last and atomically --------------------------------
SUMMARY: dict[str, str] = {
    "cell": "the cell's identity as the grid names it: network, scheme, n, p, cores, consumer, rep",
    "network": "the network trained", "consumer": "train, emulated or peak",
    "emulated": "whether the accelerator is emulated", "accelerator": "emulated, measured or none",
    "rate": "the emulated accelerator's rc (images/s)", "rate_source": "where rc came from",
    "batch_size": "global batch", "steps": "measured steps", "warmup": "the --warmup asked for",
    "cores": "cores per member (null: all)", "image_size": "preprocessed image side (px)",
    "scheme": "the sharing scheme (an auto cell: the one the plan chose)", "n": "members",
    "p": "preprocessing members",
    "planned": "--scheme auto: the plan's choice of scheme and P, its prediction, the runners-up and the inputs "
               "(null otherwise)",
    "wire_dtype": "element type on the wire", "transport": "mpi4py or horovod",
    "backend": "preprocessing backend: tf or pillow", "trainer": "the train consumer's framework (keras or torch)",
    "unit_batches": "consecutive global batches a member reads, preprocesses and exchanges at a time "
                    "(--block-images; null for the tf.data service)",
    "members_per_rank": "ensemble members each rank hosts, trained on every batch in one process",
    "gradient_exchange": "a trained data-parallel member's gradient exchange (--gradient-exchange), said in words; "
                         "ako's says its replicas differ (null without one)",
    "malloc": "the members' malloc policy in force (--malloc): keep (freed images' pages reused in place), "
              "system, or system with why keep could not be applied",
    "preprocessing": "inception or vgg", "fast_mode": "Slim's fast_mode",
    "preprocess_impl": "the built-in's implementation: crop-first, reference or fused-colour (tf), pillow or "
                       "pillow fused-colour; user for a preprocess function",
    "decode_cache": "the node-shared decoded-image cache: hit rate per epoch, bytes held, CPU saved (estimated; "
                    "null when off)",
    "approximation": "an approximate preprocessing path (fused-colour): what it is and its error against the "
                     "exact path, measured on the dataset's first images after the window (null for an exact path)",
    "seed": "base seed",
    "dataset": "path, size, digest, whether synthetic, effective shuffle buffer, and the source folder's "
               "accounting (images included, files skipped and ignored by reason; null for TFRecords)",
    "images_per_second_per_member": "mean over members of images/s in the measured window",
    "cpu_seconds_total": "the members' own process CPU-s in the measured window, summed",
    "cpu_seconds_ticks_total": "the same on the kernel's tick clock (/proc/self/stat), summed; null without /proc",
    "shared_job": "where the cell ran in a shared MPI job (enspipe run-cells): its cells, this one's position, "
                  "whether it was the first in its process, when it started; absent for a cell run alone",
    "stages_per_image": "CPU and wall s per delivered image by pipeline stage, mean over members",
    "window": "the measured window's quality: warm-up steps, steady, balance, starvation",
    "placement": "hosts, members per host, cores, oversubscription",
    "measured_window": "the job's window (first member's start to last member's end), Unix s",
    "node_cpu_seconds": "per host: node CPU-s (mpstat or psutil) in the job's window",
    "node_cpu_seconds_total": "their sum, each machine once (hosts that share a kernel see the same CPUs)",
    "hosts_per_kernel": "the most hosts sharing one kernel (>1: namespaced nodes or containers on one machine, "
                        "whose node CPU is that machine's)",
    "per_core_busy_percent": "per host and core: mean busy % (none for a host whose monitor missed the window)",
    "node_cpu_coverage": "per host: the share of the window its CPU monitor's samples cover (1: all of it)",
    "node_cpu_missing": "per host whose monitor stopped before the window ended: why it has no node CPU "
                        "(null: every host's was measured over the whole window)",
    "cpu_source": "mpstat, psutil or none",
    "energy_joules": "the headline energy in the job's window", "energy_source": "where it came from",
    "energy_modelled": "whether it is the power model's", "energy_by_source": "every source's joules",
    "energy_domains": "per source, the domains read (package, DRAM, GPU, node)",
    "energy_unavailable": "sources asked for that could not be read, and why",
    "energy_above_idle_joules": "energy minus idle power x window", "mean_watts": "energy / window",
    "idle_watts": "the node's idle power", "idle_source": "where it came from",
    "power_model": "the model's parameters (idle watts, watts per busy core)",
    "ranks": "each member's report (keys: RANK)", "machine": "CPU model, CPUs, GPUs",
    "slurm": "the Slurm job and step, inside one", "versions": "enspipe, TensorFlow, Python, MPI",
    "finished": "Unix time the summary was made",
    "failure": "why the cell failed its exactly-once promise (summary.failed.json only)",
    "delivery": "what members saw (every arm): whether exactly once is promised, the fewest distinct samples in an "
                "epoch-length window, skipped samples in all, the slow member (--slow-member)",
    "service": "tfdata_service only: dispatcher, dataset id, workers, cache MiB, compression, sharding",
}

RANK: dict[str, str] = {
    "rank": "MPI rank", "host": "host name", "role": "preprocessor, leader or compute-only; tfdata_service: dispatcher+worker, worker or trainer",
    "host_rank": "rank among the host's members", "mpi_node": "shared-memory domain (its lowest rank)",
    "cores": "the cores it was pinned to", "sharing_cores": "whether it shares them with other members",
    "threads": "its thread pools' size", "share": "[lo, hi) of each global batch it preprocesses",
    "member": "the ensemble member it trains (--data-parallel g: g ranks per member, each on its part of a batch)",
    "trained_images": "images its consumer trained on, every step (--member-epochs: none once they are done)",
    "accelerator_busy_seconds": "seconds its consumer spent training, every step",
    "member_name": "its member's name (--member-names; m<index> by default)",
    "network": "the network its member trains (train only)",
    "epochs_trained": "--member-epochs: whole epochs its member trained in this run",
    "member_state": "--member-epochs: its member's state over every run (epochs, images, converged, validation "
                    "losses, checkpoint; see enspipe.run.checkpoint)",
    "steps_measured": "steps in its measured window", "stopped_early": "whether --stop-below ended the run early",
    "learning_rate": "its member's learning rate (train)", "images": "images delivered in the window",
    "images_preprocessed": "images its preprocess stage made in the window", "seconds": "window length",
    "images_per_second": "images / seconds", "cpu_seconds": "its process CPU-s in the window",
    "cpu_seconds_ticks": "the same CPU on the kernel's tick clock (/proc/self/stat utime + stime; null without it)",
    "cpu_seconds_per_image": "cpu_seconds / images", "thread_cpu_seconds": "CPU-s by thread group",
    "stages": "CPU and wall s by pipeline stage", "step_time_p50": "median step time (s)",
    "step_time_p95": "95th percentile step time (s)", "wait_time_mean": "mean wait for a batch (s)",
    "starved_fraction": "measured steps that found no batch ready",
    "queue_occupancy": "per queue: mean and max occupancy in the window",
    "epochs": "completed epochs: count, digest, missing", "partial_epoch": "the unfinished epoch's count",
    "skipped": "keys skipped", "skipped_by_epoch": "those keys by epoch",
    "short_epochs": "epochs short of the manifest, with the keys they lack",
    "members": "the ensemble members this rank hosts (several with --members-per-rank)",
    "max_rss_bytes": "its process's peak resident memory (bytes) when it reported",
    "loss_first": "first loss (train)", "loss_last": "last loss (train)", "device": "the consumer's device",
    "measured_window": "this member's window, Unix s", "started": "when its warm-up started",
    "warmup_steps": "warm-up steps actually run", "discarded_batches": "batches made beyond the window",
    "exchange_paths": "per communicator group: node-shm, node-shm+mpi, mpi or horovod",
    "bytes_sent": "payload bytes it contributed in the window",
    "bytes_received": "payload bytes it obtained from others",
    "collective_seconds": "wall s in collectives", "collective_cpu_seconds": "CPU s in collectives",
    "collectives": "exchange steps in the window", "copy_seconds": "wall s copying its block in",
    "copy_cpu_seconds": "CPU s copying its block in",
    "delivery": "what it saw: distinct samples per epoch-length window of deliveries, samples skipped (gaps "
                "in a producer's stream), producer streams (enspipe.data.ledger.DeliveryCounter)",
    "gradient_exchange": "a data-parallel rank's gradient exchange in the window: its kind and label, the bytes it "
                         "sends a step; blocks: their count, the share of their bytes summed before "
                         "backpropagation ended and the mean wait after it (null for a member on one rank)",
    "decode_cache": "its view of the node's decode cache: hits and misses per epoch, what it stored and what not "
                    "(kept meanwhile by another decode; no room), the node's bytes, images and distinct samples "
                    "held, its timed decodes (null when off)",
    "decodes": "its preprocess stage's decodes: the pillow backend's images decoded whole for a crop, by reason "
               "(decoded_whole; its worker processes' included), the gpu backend's on its device and on the CPU "
               "(null for the tf backend)",
}
