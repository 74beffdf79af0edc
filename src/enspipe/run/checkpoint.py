"""A member's state across the runs that train it (FLEET's checkpoints): what it has trained and,
when it trains for real, its weights.

A member checkpoints at each of its epoch ends (``--checkpoint-dir``), so its checkpoint interval
is one epoch: ``DIR/<name>/`` holds a TensorFlow checkpoint of its model and optimizer
(``ckpt-<epochs>``: the weights after that many epochs, plain SGD's step counter included) and
``state.json`` (:class:`MemberState`: epochs and images trained, whether it has converged, its
validation losses, the checkpoint's prefix). The weights are written first and ``state.json``
replaces the old one atomically after them; the previous weights are deleted only then. A member
killed at any moment therefore resumes from its last complete epoch, never from half-written
files, and a run started again restores it (:func:`restore`) and trains on from the next epoch,
its early-stopping history intact.

A checkpoint that cannot be read is an error naming it (:class:`CheckpointError`), never a
silent restart from scratch; :func:`problem` checks one before any work.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field

from enspipe.common.atomic import write_json_atomic

STATE = "state.json"


class CheckpointError(RuntimeError):
    """A member's checkpoint is missing, unreadable, or not the member's."""


@dataclass
class MemberState:
    """One member's progress over every run so far (``state.json``)."""

    name: str
    network: str | None             # None: an emulated member (no weights)
    epochs: int = 0                 # whole epochs trained
    images: int = 0                 # images trained on
    converged: bool = False         # early stopping said so (its epochs' bound is the other way out)
    val_losses: list[float] = field(default_factory=list)  # after each epoch, where it is validated
    weights: str | None = None      # the TensorFlow checkpoint's prefix, relative to the member's directory
    runs: list[dict] = field(default_factory=list)  # each run that trained it: its out dir, epochs, when

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def member_dir(root: str, name: str) -> str:
    return os.path.join(root, name)


def load(root: str, name: str, network: str | None) -> MemberState | None:
    """The member's state, or None when it has none yet (never trained). Raises
    :class:`CheckpointError` naming the file when it is unreadable, another member's, or its
    weights' files are missing."""
    path = os.path.join(member_dir(root, name), STATE)
    if not os.path.exists(path):
        leftovers = [f for f in os.listdir(member_dir(root, name)) if f.startswith("ckpt-")] \
            if os.path.isdir(member_dir(root, name)) else []
        if leftovers:  # weights without their state: a checkpoint lost its record
            raise CheckpointError(f"{path} is missing but {member_dir(root, name)} holds weights {sorted(leftovers)}: "
                                  "the member's progress is unknown (remove the directory to start it over)")
        return None
    try:
        with open(path) as f:
            d = json.load(f)
        state = MemberState(**d)
    except (OSError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}); remove the member's directory to start it over") from e
    if state.name != name or state.network != network:
        raise CheckpointError(f"{path} is member {state.name!r} training {state.network!r}, not {name!r} training "
                              f"{network!r}: another ensemble's checkpoints? (pass another --checkpoint-dir)")
    if state.weights is not None and not os.path.exists(os.path.join(member_dir(root, name), state.weights + ".index")):
        raise CheckpointError(f"{path} names weights {state.weights!r} that are not in {member_dir(root, name)}")
    return state


def problem(root: str, name: str, network: str | None) -> str | None:
    """Why the member's checkpoint could not be resumed from (None: it can, or there is none),
    reading the weights' index too."""
    try:
        state = load(root, name, network)
        if state is not None and state.weights is not None:
            from enspipe.common.tfimport import import_tensorflow

            import_tensorflow(trains=False)  # before MPI starts: the index is read, nothing trained
            import tensorflow as tf

            tf.train.load_checkpoint(os.path.join(member_dir(root, name), state.weights))
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # TensorFlow's errors for a corrupt index or data file
        return f"{member_dir(root, name)}: the weights {state.weights!r} are unreadable ({type(e).__name__}: " \
               f"{str(e).splitlines()[0][:200]}); remove the directory to start the member over"
    return None


def save(root: str, state: MemberState, trackable=None) -> str | None:
    """Write the member's weights (``trackable``: a ``tf.train.Checkpoint``; none for an emulated
    member), then its state atomically, then delete older weights; returns the weights' prefix."""
    d = member_dir(root, state.name)
    os.makedirs(d, exist_ok=True)
    if trackable is not None:
        prefix = f"ckpt-{state.epochs}"
        trackable.write(os.path.join(d, prefix))
        state.weights = prefix
    write_json_atomic(os.path.join(d, STATE), state.as_dict())
    for f in os.listdir(d):  # older weights, and what a write killed midway left (TensorFlow's ckpt-N_temp/)
        if f.startswith("ckpt-") and not (state.weights and f.startswith(state.weights + ".")):
            path = os.path.join(d, f)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return state.weights


def restore(root: str, state: MemberState, trackable) -> None:
    """Load the member's weights into ``trackable`` (every object that exists must match)."""
    path = os.path.join(member_dir(root, state.name), state.weights)
    try:
        trackable.read(path).assert_existing_objects_matched()
    except Exception as e:
        raise CheckpointError(f"{path}: cannot restore the member's weights ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200]})") from e
