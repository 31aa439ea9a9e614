"""Engine helpers that need no engine: stop strings split into stop tokens, the process tree and
its priority, GPU placement."""

import os
import subprocess
import sys

from transformers import AutoTokenizer

from libra.rollout.engines import _comm, _descendants, _renice, split_stops, visible_gpus
from libra.rollout.protocol import STOPS


def test_single_token_stop_strings_become_stop_token_ids(policy_dir):
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    strings, ids = split_stops(tokenizer, [*STOPS, "DONE!"])
    assert ids == tokenizer.convert_tokens_to_ids(list(STOPS))  # the protocol's tags are special tokens
    assert strings == ["DONE!"]  # several tokens: matched on the text


def test_descendants_and_renice_reach_every_thread_of_a_grandchild():
    grandchild_code = ("import os, threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start();"
                       "print(os.getpid(), flush=True); time.sleep(30)")
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild_code!r}]); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())  # printed once its second thread runs
        assert {child.pid, grandchild} <= set(_descendants(os.getpid()))
        assert _comm(grandchild).startswith("python")
        own = os.getpriority(os.PRIO_PROCESS, 0)
        _renice(grandchild, min(19, own + 7))
        threads = os.listdir(f"/proc/{grandchild}/task")
        assert len(threads) == 2
        assert [os.getpriority(os.PRIO_PROCESS, int(t)) for t in threads] == [min(19, own + 7)] * 2
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == own  # its parent is left as it was
    finally:
        for pid in (grandchild, child.pid):
            if pid is not None:
                os.kill(pid, 9)
        child.wait()


def test_visible_gpus_narrows_and_restores_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with visible_gpus([1, 2]):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    with visible_gpus([2, 3]):  # indices among the GPUs this process already sees
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    with visible_gpus(None):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
