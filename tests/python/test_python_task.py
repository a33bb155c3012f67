"""Tasks written in Python: trained, evaluated, interrupted and resumed as the program's are."""
import os
import signal

import numpy as np
import pytest

import qkv


class Previous:
    """Each position points at the one before it (pointer readout; position 0 is not scored)."""
    name = "previous"
    vocab_size = 16
    readout = "pointer"

    def __init__(self, length=12):
        self.length = length

    def sample(self, batch, seed):
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, self.vocab_size, size=(batch, self.length))
        targets = np.tile(np.arange(-1, self.length - 1), (batch, 1))
        return {"tokens": tokens, "targets": targets}


class FirstAtEnd:
    """The last position predicts the first token (token readout; only the last position is scored)."""
    name = "first-at-end"
    vocab_size = 10
    readout = "token"
    max_len = 6

    def sample(self, batch, seed):
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, 10, size=(batch, 6))
        targets = np.full((batch, 6), -1)
        targets[:, -1] = tokens[:, 0]
        return {"tokens": tokens, "targets": targets}


def test_a_task_written_in_python_trains_to_its_target_and_evaluates_on_fresh_sequences(tmp_path):
    result = qkv.train(Previous(), out=str(tmp_path / "prev"), steps=300)
    assert result["task"] == "previous" and result["steps"] == 300
    assert result["accuracy"] >= 0.99
    first = qkv.train(FirstAtEnd(), out=str(tmp_path / "first"), steps=600)
    assert first["accuracy"] >= 0.99
    # Scored on its last position only: a model that copied the last token instead would score 10%.
    evaluated = qkv.evaluate(str(tmp_path / "first"), n=512, seed=7)
    assert evaluated["task"] == "first-at-end" and evaluated["accuracy"] >= 0.99
    # The run's model, loaded, answers by hand-made sequences.
    model = qkv.load_run(str(tmp_path / "first"))
    tokens = np.array([[7, 1, 2, 3, 4, 5], [2, 9, 9, 9, 9, 9]])
    assert list(model(tokens)[:, -1].argmax(-1)) == [7, 2]
    scores = qkv.load_run(str(tmp_path / "prev"))(np.arange(12) % 16)
    assert list(scores[0, 1:].argmax(-1)) == list(range(11))


class SignalAt(Previous):
    """Previous, whose `at`-th batch comes with a signal to the process, as a Ctrl-C would."""

    def __init__(self, at, signum):
        super().__init__()
        self.calls, self.at, self.signum = 0, at, signum

    def sample(self, batch, seed):
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), self.signum)
        return super().sample(batch, seed)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_same_seed_trains_the_same_weights_and_an_interrupted_run_resumes_to_them(tmp_path, signum):
    whole = tmp_path / "whole"
    qkv.train(Previous(), out=str(whole), steps=400, checkpoint_every=100000, seed=5)
    part = tmp_path / "part"
    handler = signal.getsignal(signum)
    # Registration draws two batches (one for the length, one to check); then training one a step.
    with pytest.raises(KeyboardInterrupt, match="interrupted at step 150 of 400; the checkpoint of step 150 is in"):
        qkv.train(SignalAt(152, signum), out=str(part), steps=400, checkpoint_every=100000, seed=5)
    assert signal.getsignal(signum) is handler  # Python's handler is back
    assert os.readlink(part / "checkpoint") == "checkpoint-00000150"
    with pytest.raises(ValueError, match="resume=True takes the run's options from its config.json"):
        qkv.train(Previous(), out=str(part), resume=True, lr=0.1)
    assert qkv.train(Previous(), out=str(part), resume=True)["steps"] == 400
    a, b = qkv.load_run(str(whole)).state_dict(), qkv.load_run(str(part)).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    other = tmp_path / "other"
    qkv.train(Previous(), out=str(other), steps=400, checkpoint_every=100000, seed=6)
    assert not np.array_equal(qkv.load_run(str(other)).state_dict()["tok.weight"],
                              qkv.load_run(str(whole)).state_dict()["tok.weight"])


class Broken(Previous):
    name = "broken"

    def __init__(self, **changes):
        super().__init__()
        self.changes = changes

    def sample(self, batch, seed):
        drawn = super().sample(batch, seed)
        if "error" in self.changes:
            raise self.changes["error"]
        for key, (row, pos, value) in self.changes.items():
            drawn[key][row, pos] = value
        return drawn


def test_a_task_that_breaks_the_protocol_is_named_before_any_folder_is_touched(tmp_path):
    out = tmp_path / "run"

    def refused(task, message):
        with pytest.raises(ValueError, match=message):
            qkv.train(task, out=str(out), steps=5)
        assert not out.exists()

    refused(Broken(tokens=(1, 3, 16)), r"task 'broken': sample\(2, \d+\) returned token 16 at row 1, position 3; token ids are 0-15")
    refused(Broken(targets=(0, 4, 7)),
            r"returned target 7 at row 0, position 4; a causal pointer target is a position up to its own, 0-4")
    refused(Broken(targets=(0, 2, -5)), "returned target -5 at row 0, position 2")

    class NoVocabulary:
        readout = "token"

        def sample(self, batch, seed):
            return {}

    refused(NoVocabulary(), "task 'NoVocabulary': has no `vocab_size`")

    class BadReadout(Previous):
        readout = "class"

    refused(BadReadout(), "readout is 'class'")

    class NotADict(Previous):
        name = "not-a-dict"

        def sample(self, batch, seed):
            return (1, 2)

    refused(NotADict(), r"sample\(64, 0\) returned <class 'tuple'>; a dict of \"tokens\" and \"targets\"")

    class Builtin(Previous):
        name = "brackets"

    refused(Builtin(), "'brackets' is a built-in task's name")
    # The task's own exception, as it raised it.
    with pytest.raises(ZeroDivisionError, match="no batch today"):
        qkv.train(Broken(error=ZeroDivisionError("no batch today")), out=str(out), steps=5)
    assert not out.exists()


def test_a_registered_task_s_runs_are_inspected_and_ablated(tmp_path):
    qkv.train(Previous(), out=str(tmp_path / "prev"), steps=200, layers=1, heads=2)
    assert qkv.register_task(Previous()) == "previous"
    report = qkv.inspect(str(tmp_path / "prev"))
    assert report["task"] == "previous" and len(report["layers"]) == 1
    ablation = qkv.ablate(str(tmp_path / "prev"), n=64)
    assert ablation["task"] == "previous" and len(ablation["heads"]) == 2


class Calls(Previous):
    """Previous, which calls `during(self)` in its `at`-th sample()."""
    name = "previous-calls"

    def __init__(self, at, during):
        super().__init__()
        self.calls, self.at, self.during, self.seen = 0, at, during, None

    def sample(self, batch, seed):
        self.calls += 1
        if self.calls == self.at:
            self.seen = self.during(self)
        return super().sample(batch, seed)


def test_one_training_call_at_a_time_and_a_late_ctrl_c_comes_back_to_python(tmp_path):
    def train_again(task):
        try:
            qkv.train(Previous(), out=str(tmp_path / "inner"), steps=5)
        except RuntimeError as e:
            return str(e)

    task = Calls(10, train_again)
    qkv.train(task, out=str(tmp_path / "outer"), steps=20)
    assert task.seen == "qkv: another qkv.train or qkv.sweep is running in this process"
    assert not (tmp_path / "inner").exists()
    # A Ctrl-C in the last step: the run ends whole, then Python gets its KeyboardInterrupt.
    late = Calls(2 + 20, lambda t: os.kill(os.getpid(), signal.SIGINT))  # two batches at registration
    with pytest.raises(KeyboardInterrupt):
        qkv.train(late, out=str(tmp_path / "late"), steps=20)
    assert os.readlink(tmp_path / "late" / "checkpoint") == "checkpoint-00000020"
    # And nothing is left pending: the next run trains.
    assert qkv.train(Previous(), out=str(tmp_path / "next"), steps=20)["steps"] == 20


def test_numpy_integers_are_whole_numbers_and_bad_facts_are_refused(tmp_path):
    class NumpySized(Previous):
        name = "numpy-sized"
        vocab_size = np.int64(16)
        max_len = np.int32(12)

    assert qkv.train(NumpySized(), out=str(tmp_path / "n"), steps=5)["steps"] == 5

    class BadTarget(Previous):
        name = "bad-target"
        target = 1.5

    with pytest.raises(ValueError, match=r"task 'bad-target': target is 1.5; a share in \(0, 1\]"):
        qkv.train(BadTarget(), out=str(tmp_path / "t"), steps=5)

    class OnPadding(Previous):
        name = "on-padding"
        pad = 15

        def sample(self, batch, seed):
            drawn = super().sample(batch, seed)
            drawn["tokens"][:, 3] = 15
            return drawn

    with pytest.raises(ValueError, match="returned target 3 at row 0, position 4, which holds the padding token 15"):
        qkv.train(OnPadding(), out=str(tmp_path / "p"), steps=5)
