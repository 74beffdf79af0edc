"""One pass over a SharedStream is one epoch, as a DataLoader's is (enspipe.api.epochs): at a batch
size that does not divide the dataset, ceil(N/B) batches with a short last one (or drop_last's
whole ones, the tail in the ledger), every sample exactly once, on every scheme; and the samples,
their order and values are the stream's own: the same sequence as at a batch size that divides it."""
import pytest

from conftest import said
from test_api import member_cases

N = 50  # the dataset fixture's samples
BASE = {"image_size": 32, "backend": "pillow", "threads": 1, "epochs": 3}


def _sequence(member):
    return [s for one in member["passes"] for batch in one for s in batch["samples"]]


@pytest.mark.mpi
def test_a_pass_is_an_epoch_on_every_scheme_with_the_streams_own_samples(dataset, tmp_path):
    cases = {
        "reference": ("epochs", {**BASE, "data": dataset, "batch_size": 10}),
        "all_shared": ("epochs", {**BASE, "data": dataset, "batch_size": 12}),
        "single_broadcast": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "scheme": "single_broadcast",
                                        "preprocessors": 1}),
        "multi_broadcast": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "scheme": "multi_broadcast",
                                       "preprocessors": 2}),
        "no_node_shm": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "node_shm": False}),
        "baseline_ref": ("epochs", {**BASE, "data": dataset, "batch_size": 10, "scheme": "baseline"}),
        "baseline": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "scheme": "baseline"}),
        "drop_last": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "drop_last": True}),
        "batch_over_epoch": ("epochs", {**BASE, "data": dataset, "batch_size": 64}),
    }
    r, res = member_cases(2, tmp_path, cases)
    assert r.returncode == 0, said(r)
    assert all(len(res[name]) == 2 for name in cases), said(r)
    reference = _sequence(res["reference"][0])
    assert len(reference) == 3 * N and len({d for d, _ in reference[:N]}) == N
    for name in ("all_shared", "single_broadcast", "multi_broadcast", "no_node_shm", "baseline", "drop_last",
                 "batch_over_epoch"):
        for member in res[name]:
            whole = name == "drop_last"
            lengths = [[b["len"] for b in one] for one in member["passes"]]
            batch = 64 if name == "batch_over_epoch" else 12
            want = [batch] * (N // batch) + ([] if whole or N % batch == 0 else [N % batch])
            assert lengths == [want] * 3, (name, lengths)
            assert member["len"] == len(want), name
            assert member["dataset_batch"] == (batch if whole else None), name
            epochs = member["epochs"]
            assert [(e["epoch"], e["count"], e["missing"]) for e in epochs] == [(k, N, 0) for k in range(3)], name
            if whole:
                assert [e["dropped"] for e in epochs] == [N % 12] * 3
            for one in member["passes"]:  # every sample exactly once per pass
                assert len({d for b in one for d, _ in b["samples"]}) == sum(b["len"] for b in one)
            seq = _sequence(member)
            if name.startswith("baseline"):  # each baseline member has a stream of its own
                mine = _sequence(res["baseline_ref"][res[name].index(member)])
                assert seq == mine, name
            elif whole:  # the stream's samples less each epoch's tail
                assert seq == [s for e in range(3) for s in reference[e * N:e * N + 48]]
            else:
                assert seq == reference, name
        if not name.startswith("baseline"):
            assert _sequence(res[name][0]) == _sequence(res[name][1]), name


@pytest.mark.mpi
def test_a_torch_pass_is_an_epoch_too(dataset, tmp_path):
    pytest.importorskip("torch", reason="pip install torch")
    cases = {"numpy": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "epochs": 2}),
             "torch": ("epochs", {**BASE, "data": dataset, "batch_size": 12, "epochs": 2, "via": "torch"})}
    r, res = member_cases(2, tmp_path, cases)
    assert r.returncode == 0, said(r)
    for member in res["torch"]:
        assert [[b["len"] for b in one] for one in member["passes"]] == [[12, 12, 12, 12, 2]] * 2
    assert _sequence(res["torch"][0]) == _sequence(res["numpy"][0])
