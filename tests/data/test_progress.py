"""Progress of the long phases (issue 49): tokenizing prints progress in a log, whole lines and no carriage returns;
short phases print nothing; the bar never reaches a mapped function's fingerprint (datasets' cache key)."""

from __future__ import annotations

import io
import re
import signal

from prefzoo.train.checkpoint.save import find_latest_checkpoint
from tests.faults._run import slow_to_tokenize, start_cli, wait_for
from tests.train.helpers import base_config

PROGRESS = re.compile(r"^tokenizing pairs: (\d+)/(\d+) pairs \((\d+)%\), (\d+) s", re.M)


def test_tokenizing_prints_progress_in_a_log_before_the_first_step(tmp_path, tiny_dir):
    out = tmp_path / "run"
    cfg = base_config(tiny_dir, slow_to_tokenize(tmp_path / "long.jsonl"), out, max_steps=1, progress=True)
    log = tmp_path / "run.log"  # not a terminal: lines, not a bar
    proc = start_cli(cfg, log, HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"))
    wait_for(lambda: PROGRESS.search(log.read_text()), 300, "a progress line while tokenizing", proc, log)
    text = log.read_text()
    seen = PROGRESS.search(text)
    done, total, percent = int(seen.group(1)), int(seen.group(2)), int(seen.group(3))
    assert 0 < done < total and percent == 100 * done // total, seen.group(0)
    assert b"\r" not in log.read_bytes()  # no carriage return (read_text would turn one into \n)
    assert not (out / "metrics.jsonl").exists()  # it came while tokenizing, before any step
    proc.send_signal(signal.SIGTERM)  # done with it: a signal before the first step ends the run at once
    assert proc.wait(timeout=300) == 143, log.read_text()[-3000:]  # 128 + SIGTERM
    text = log.read_text()
    assert text.rstrip().splitlines()[-1] == (
        "prefzoo train: stopped by SIGTERM before the first training step: nothing was trained or saved; rerun the "
        "same command to start again"
    )
    assert "Traceback" not in text and find_latest_checkpoint(out) is None


def _clock(monkeypatch, times):
    """time.monotonic() as seen by prefzoo.data.progress: the given values, one per call."""
    import prefzoo.data.progress as progress

    it = iter(times)
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(it))


def test_a_log_gets_a_line_after_the_delay_then_every_interval_and_a_last_one(monkeypatch):
    from prefzoo.data.progress import Progress

    stream = io.StringIO()  # not a terminal
    _clock(monkeypatch, [0.0, 1.0, 2.5, 5.0, 12.6, 13.0, 14.0])
    with Progress(100, "tokenizing pairs", unit="pairs", stream=stream) as bar:  # opened at 0.0
        for _ in range(5):  # at 1.0 (before the delay), 2.5 (a line), 5.0 (too soon), 12.6 (a line), 13.0 (too soon)
            bar.update(20)
    lines = stream.getvalue().splitlines()  # closed at 14.0
    assert lines == [
        "tokenizing pairs: 40/100 pairs (40%), 2 s, about 4 s left",  # 40 in 2.5 s: 60 more take 3.75 s
        "tokenizing pairs: 80/100 pairs (80%), 13 s, about 3 s left",  # 80 in 12.6 s: 20 more take 3.15 s
        "tokenizing pairs: 100/100 pairs in 14.0 s",
    ], lines
    assert "\r" not in stream.getvalue()


def test_a_short_phase_an_interrupted_one_or_a_switched_off_one_prints_nothing(monkeypatch):
    from prefzoo.data.progress import Progress

    stream = io.StringIO()
    with Progress(10, "quick", stream=stream) as bar:  # done in well under the 2 s delay
        bar.update(10)
    try:
        with Progress(10, "interrupted", stream=stream, delay=0.0) as bar:
            bar.update(5)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    with Progress(10, "off", stream=stream, delay=0.0, enabled=False) as bar:
        bar.update(10)
    assert stream.getvalue().splitlines() == ["interrupted: 5/10 rows (50%), 0 s, about 0 s left"]


def test_the_bar_does_not_reach_a_mapped_function_s_fingerprint():
    from datasets.fingerprint import Hasher

    from prefzoo.data.progress import Progress, counted

    scale = 3
    fn = counted(lambda row: {"x": row["a"] * scale})
    closed = Hasher.hash(fn)
    with Progress(10, "tokenizing", stream=io.StringIO()) as bar, bar.counting():
        assert Hasher.hash(fn) == closed  # the same cache key whether or not a bar is counting


def test_whoever_tokenizes_says_whether_the_bar_shows(monkeypatch):
    """No process-wide switch: ``progress`` travels with the call (the trainer passes False for --no-progress and on
    every process but rank 0)."""
    import datasets

    import prefzoo.data.tokenize as tokenize
    from prefzoo.data.progress import Progress
    from prefzoo.testing import char_tokenizer

    seen = []

    class Recorder(Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.enabled)

    monkeypatch.setattr(tokenize, "Progress", Recorder)
    ds = datasets.Dataset.from_list([{"id": "a", "prompt": "1+1=", "chosen": "2", "rejected": "3"}])
    for progress in (False, True):
        tokenize.tokenize_pairs(ds, char_tokenizer("0123456789+="), 8, 4, progress=progress)
    assert seen == [False, True]
