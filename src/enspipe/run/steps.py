"""The consumer side of one member in a measured cell: each step takes a batch from its pipeline,
feeds its consumer, keeps the exactly-once ledger and logs the step; at its epoch ends it
validates, checkpoints and may stop early. Fault injection for the tests lives here too."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, NamedTuple

from enspipe.common import keys
from enspipe.data.keys import batch_checksum, digest_of
from enspipe.measure import threadcpu
from enspipe.plan.ensemble import converged
from enspipe.run import checkpoint
from enspipe.run.config import RunConfig

if TYPE_CHECKING:
    from enspipe.run.context import Life


class Member:
    """One member's consumer side: takes its pipeline's batches, feeds its consumer, keeps the
    exactly-once ledger and logs one event per step; the measured steps' numbers accumulate."""

    def __init__(self, cfg: RunConfig, rank: int, pipeline, consumer, ledger, delivery, events, progress: dict,
                 until: int | None = None, life: "Life | None" = None):
        self.cfg, self.pipeline, self.consumer, self.ledger, self.events = cfg, pipeline, consumer, ledger, events
        self.until = until  # the step from which its member has trained its epochs: its accelerators idle
        self.life = life    # --member-epochs: its epoch ends (validation, checkpoint, early stopping)
        self.epochs_trained = 0  # in this run
        self.trained, self.busy_seconds = 0, 0.0  # images trained on and seconds training, every step
        self.delivery = delivery  # what it saw, judged alike for every arm (DeliveryCounter)
        self.progress = progress
        self.fault = injected_fault(rank)
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.exchanges: list[dict] = []  # a block exchange's record of each measured step
        self.losses: list[float] = []
        self.images = self.starved = 0

    def step(self, step: int, measured: bool) -> bool:
        """Consume one batch; returns what the pipeline looked like when it was asked for it (see
        :class:`Look`): whether the batch was missing, whether every queue was full and how many
        batches the queues held."""
        self.progress["step"] = step
        if self.fault and self.fault[0] == step:
            inject(self.fault[1], step)
        cpu_req = time.thread_time()
        queues = self.pipeline.occupancy()
        starved, saturated = queues["compute"] == 0, self.pipeline.saturated()
        t_req = time.perf_counter()
        batch = self.pipeline.next_batch()
        t_got, cpu_got = time.perf_counter(), time.thread_time()
        idle = self.until is not None and step >= self.until
        out = {"idle": True} if idle else self.consumer.step(batch.images, batch.meta[:, 3])
        t_done, cpu_done = time.perf_counter(), time.thread_time()
        if not idle:
            self.trained += len(batch)
            self.busy_seconds += t_done - t_got
            if self.life is not None and self.trained % self.life.epoch_images == 0:
                out = {**out, **self.epoch_end(step)}
        self.ledger.add(batch.meta[:, 0], batch.meta[:, 1])
        self.delivery.add(batch.meta[:, 0], batch.meta[:, 2], batch.stream)
        if measured:
            self.images += len(batch)
            self.starved += starved
            self.step_times.append(t_done - t_req)
            self.waits.append(t_got - t_req)
            if "exchange" in out:
                self.exchanges.append(out["exchange"])
        if "loss" in out:
            self.losses.append(out["loss"])
        self.events.log(keys.STEP, step=step, images=len(batch), wait_s=t_got - t_req, compute_s=t_done - t_got,
                        cpu_s=threadcpu.process_cpu(),
                        measured=measured, queues=queues, starved=starved, saturated=saturated,
                        batch_digest=digest_of(batch.meta[:, 0]),
                        **({"batch_checksum": batch_checksum(batch)} if self.cfg.measure.batch_checksums else {}),
                        **out)
        clock = self.pipeline.clock
        clock.add("consume", t_done - t_got, cpu_done - cpu_got)
        clock.add("hand_off", t_got - t_req, time.thread_time() - cpu_done + cpu_got - cpu_req)
        return Look(starved, saturated, sum(queues.values()))

    def epoch_end(self, step: int) -> dict:
        """The member has trained another whole epoch at ``step``: validate it, decide whether it
        has converged (early stopping), checkpoint it (its first rank), and, converged or at its
        epochs' bound, leave its accelerators idle from the next step."""
        life, state = self.life, self.life.state
        self.epochs_trained += 1
        state.epochs += 1
        state.images += life.epoch_images
        state.runs[-1]["epochs"] = self.epochs_trained
        val = self.consumer.evaluate(*life.validation) if life.validation is not None else None
        if val is not None:
            state.val_losses.append(val)
        state.converged = converged(state.val_losses, life.patience, life.min_delta)
        saved = checkpoint.save(life.checkpoint_dir, state, self.consumer.trackable()) if life.checkpoint_dir else None
        if state.converged:
            self.until = step + 1
        self.events.log(keys.MEMBER_EPOCH, step=step, member=state.name, epochs=state.epochs, val_loss=val,
                        converged=state.converged, checkpoint=saved,
                        idle_from=self.until)
        return {"member_epoch": state.epochs, **({"val_loss": val} if val is not None else {})}

    def capacity(self) -> int:
        """The most batches its producers can have made ahead of its consumer: its queues full, and
        a unit more in each of the stages that fill them (one waiting to put, one inside tf.data)."""
        return len(self.pipeline.occupancy()) * self.pipeline.depth + 2 * self.pipeline.unit

    def epoch_ends(self, step: int) -> bool:
        """Whether every member's epoch ends with ``step`` (every member has trained or idled
        through the same steps of the one stream)."""
        return (step + 1) * self.cfg.global_batch % self.ledger.num_images == 0

    def training_after(self, step: int) -> int:
        """1 while this rank's member still trains after ``step``, else 0."""
        return int(self.until is None or self.until > step + 1)


class Look(NamedTuple):
    starved: bool     # the consumer's batch was not there yet
    saturated: bool   # every queue this member fills was full
    held: int         # batches in this member's queues


def injected_fault(rank: int) -> tuple[int, str] | None:
    """Fault injection for the fault-tolerance tests: ``ENSPIPE_INJECT_FAULT=rank:step:raise|kill|crash|stall``
    (crash: a segmentation fault, as native code dies; stall: a straggler, its consumer stopped for
    2 s while its producers run on; ``stall=S``: for S seconds)."""
    spec = os.environ.get("ENSPIPE_INJECT_FAULT")
    if not spec:
        return None
    r, step, kind = spec.split(":")
    return (int(step), kind) if int(r) == rank else None


def inject(kind: str, step: int) -> None:
    if kind.startswith("stall"):
        time.sleep(float(kind.partition("=")[2] or 2.0))
        return
    if kind == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "crash":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise RuntimeError(f"injected fault at step {step}")
