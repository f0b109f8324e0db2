"""Several processes and machines: joining a group after torchrun restarts it, a lost
worker, a run resumed with another number of processes, and every node holding the same
token files. The torchrun tests are slow; the pieces they rely on are tested fast."""

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import train
from bench import elastic
from cli.program import UserError
from conftest import ROOT, make_trainer
from data.prepare import content_digest
from training import distributed
from training.distributed import Distributed, JoinError, launch_store
from training.preparation import check_same_data

# several processes talking over local ports: one test at a time, never beside another such test
# (two launches at once may meet each other's workers), on one pytest worker (pytest.ini: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("processes")

TINY = str(ROOT / "configs" / "tiny.yaml")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="finds torchrun's workers with pgrep")


@pytest.fixture
def agent_store(monkeypatch):
    """A store like the one torchrun's agent keeps for the whole job, and the environment
    its workers see."""
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    return store


def join_all(world_size: int) -> list:
    """Each rank calls launch_store in its own thread, as the processes of one launch do."""
    results = [None] * world_size

    def join(rank):
        try:
            results[rank] = launch_store(Distributed(rank=rank, world_size=world_size))
        except JoinError as e:
            results[rank] = e

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_restarted_workers_never_read_the_keys_of_dead_ones(agent_store):
    """Launch 0 ended after joining (its processes were killed later); launch 1 died while
    joining, with only rank 1 there. The new processes must meet in a launch of their own."""
    agent_store.add("workers/launch", 1)
    for key in ("0/claim0", "0/claim1", "0/ready0", "0/ready1", "1/claim1"):
        agent_store.set(f"workers/{key}", "a dead process")
    stores = join_all(3)
    assert all(isinstance(s, dist.PrefixStore) for s in stores), stores
    for rank, store in enumerate(stores):
        store.set(f"hello{rank}", f"from {rank}")
    assert [stores[0].get(f"hello{rank}") for rank in range(3)] == [b"from 0", b"from 1", b"from 2"]
    assert agent_store.get("workers/2/hello1") == b"from 1"  # launch 2: the first whose slots were all free
    assert agent_store.get("workers/2/claim0") != b"a dead process"


def test_a_fresh_job_joins_launch_zero_and_the_next_joins_launch_one(agent_store):
    first = join_all(2)
    first[0].set("x", "1")
    assert agent_store.check(["workers/0/x"])
    second = join_all(2)  # the same job restarted: launch 0's slots are taken
    second[1].set("y", "1")
    assert agent_store.check(["workers/1/y"])


def test_a_missing_process_stops_the_join_in_bounded_time(agent_store, monkeypatch):
    monkeypatch.setattr(distributed, "JOIN_SECONDS", 1)
    start = time.monotonic()
    with pytest.raises(JoinError, match="the 2 processes did not all join within 1 s"):
        launch_store(Distributed(rank=0, world_size=2))  # rank 1 never comes
    assert time.monotonic() - start < 5


def test_an_unreachable_agent_store_fails_within_the_join_time(monkeypatch):
    """The store's connection waits JOIN_SECONDS too (TCPStore's own default is 300 s)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setattr(distributed, "JOIN_SECONDS", 1)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        launch_store(Distributed(rank=0, world_size=2))
    assert time.monotonic() - start < 10


def test_setup_joins_the_group_torchrun_describes(agent_store, monkeypatch):
    """One process under torchrun: gloo on the CPU, through this launch's own prefix of
    the agent's store; close() leaves no group behind."""
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(name, value)
    d = distributed.join_process_group("cpu")
    try:
        assert d == Distributed(rank=0, local_rank=0, world_size=1)
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert agent_store.check(["workers/0/claim0", "workers/0/ready0"])
        monkeypatch.setattr(Distributed, "enabled", property(lambda self: True))  # through the group, not around it
        assert d.gather({"iter": 7}) == [{"iter": 7}]  # one rank, one value
        assert d.sum([1.5, 2.0], torch.device("cpu")) == [1.5, 2.0]
    finally:
        d.close()
    assert not dist.is_initialized()


def test_setup_reads_the_ranks_and_picks_the_backend(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("cuda device", index)))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.join_process_group("cuda") == Distributed() and calls == []  # not under torchrun: one process
    for name, value in {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(name, value)
    assert distributed.join_process_group("cuda") == Distributed(rank=5, local_rank=1, world_size=8)
    assert calls == [("cuda device", 1), {"backend": "nccl"}]  # each process on its own GPU of the node
    calls.clear()
    monkeypatch.delenv("LOCAL_RANK")
    assert distributed.join_process_group("cpu") == Distributed(rank=5, local_rank=0, world_size=8)
    assert calls == [{"backend": "gloo"}]


def test_fresh_is_refused_under_torchrun_restarts(micro, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    assert train.main(["--config", TINY, *micro(), "--fresh"]) == 2
    assert "--fresh under torchrun --max-restarts would start the run over" in capsys.readouterr().err


def test_nodes_count_machines_from_torchruns_local_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert Distributed(rank=0, world_size=8).nodes == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert Distributed(rank=0, world_size=8).nodes == 1


def test_token_files_are_compared_by_content_not_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        for name in ("tokenizer.json", "train.bin", "val.bin"):
            (folder / name).write_bytes(name.encode() * 100)
    assert content_digest(a) == content_digest(b)
    (b / "train.bin").write_bytes(b"train.bin" * 99 + b"trains.bi")
    assert content_digest(a) != content_digest(b)
    (b / "train.bin").write_bytes((a / "train.bin").read_bytes())
    (b / "tokenizer.json").write_bytes(b"another tokenizer")
    assert content_digest(a) != content_digest(b)


class Gathered:
    """Distributed.gather as rank 0 of several sees it: what this process sent, then what
    the other ranks sent (`others`, a (host, value) each)."""

    def __init__(self, *others):
        self.others = others

    def gather(self, mine):
        return [mine, *self.others]


def test_a_node_with_other_token_files_is_named(tmp_path):
    data = type("Data", (), {"directory": tmp_path})()
    for name in ("tokenizer.json", "train.bin", "val.bin"):
        (tmp_path / name).write_bytes(b"tokens")
    check_same_data(data, Gathered(("node-b", content_digest(tmp_path))))
    here = socket.gethostname()
    with pytest.raises(UserError, match=rf"node node-b \(rank 1\) holds other token files than rank 0 on {here} "):
        check_same_data(data, Gathered(("node-b", "0" * 64)))
    with pytest.raises(UserError, match=r"node node-c \(rank 2\) holds other token files"):
        check_same_data(data, Gathered(("node-b", content_digest(tmp_path)), ("node-c", "0" * 64)))


def test_every_node_must_find_rank_0s_checkpoint(tmp_path):
    from training.resume import check_same_checkpoint

    def check(state, *others):
        check_same_checkpoint(Gathered(*others), state, tmp_path)

    check(SimpleNamespace(iteration=10), ("b", 10))
    check(None, ("b", None))
    here = socket.gethostname()
    with pytest.raises(UserError, match=rf"node b \(rank 1\) finds no checkpoint in .*, rank 0 on {here} the "
                                        r"checkpoint of iteration 10: put out_dir on storage every node shares"):
        check(SimpleNamespace(iteration=10), ("b", None))
    with pytest.raises(UserError, match=r"node b \(rank 1\) finds the checkpoint of iteration 10 in .*, rank 0 "
                                        r"on .* no checkpoint"):
        check(None, ("b", 10))
    with pytest.raises(UserError, match=r"node c \(rank 2\) finds the checkpoint of iteration 5"):
        check(SimpleNamespace(iteration=10), ("b", 10), ("c", 5))


def test_a_run_resumed_with_other_process_counts_keeps_its_global_batch(micro, tmp_path, capsys):
    """A checkpoint of 2 processes × grad_accum 1 resumed by one process: grad_accum 2,
    and the windows of the next step are those the two processes would have drawn."""
    settings = ("train.max_iters=4", "train.eval_interval=4", "train.sample_tokens=0")
    assert train.main(["--config", TINY, *micro(*settings)]) == 0
    state_file = tmp_path / "run" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    state["ranks"] = [state["ranks"][0], state["ranks"][0]]  # as two processes save it: the same sampler
    torch.save(state, state_file)
    resumed = make_trainer(micro(*settings[1:], "train.max_iters=8"))
    assert resumed.grad_accum == 2 and resumed.iteration == 4
    assert "resuming a 2-process run with 1: train.grad_accum 1 -> 2 keeps the global batch of 16" \
        in capsys.readouterr().err
    two_ranks = [elastic_sampler(resumed, state, rank) for rank in (0, 1)]
    assert torch.equal(resumed.sampler.next_batch()[0], two_ranks[0])
    assert torch.equal(resumed.sampler.next_batch()[0], two_ranks[1])
    state["ranks"] = [state["ranks"][0]] * 3  # three processes, each with the saved grad_accum of 1
    torch.save(state, state_file)
    three = make_trainer(micro(*settings[1:], "train.max_iters=8", "train.grad_accum=2"))
    assert three.grad_accum == 3  # from the checkpoint's processes and grad_accum, not the config's 2


def elastic_sampler(trainer, state, rank):
    """The windows rank `rank` of 2 would draw next from the saved sampler state."""
    from data.batches import BatchSampler

    sampler = BatchSampler(trainer.run.data.train, trainer.run.model_config.block_size, trainer.settings.batch_size,
                           trainer.settings.seed, rank, 2)
    sampler.load_state_dict(state["ranks"][0]["sampler"])
    return sampler.next_batch()[0]


def test_uneven_process_counts_say_the_global_batch_changes(capsys):
    from training.resume import grad_accum_for

    two = Distributed(rank=0, world_size=2)  # what rank 0 of 2 decides for a 3-process checkpoint
    assert grad_accum_for(SimpleNamespace(ranks=[{}] * 3, grad_accum=1), two,
                          SimpleNamespace(batch_size=8, grad_accum=1)) == 1
    assert "resuming a 3-process run with 2: its 3 micro-batches per step do not split evenly over 2 " \
           "processes, so the global batch becomes 16 sequences" in capsys.readouterr().err
    # 4 processes' micro-batches, 2 for each of these 2
    assert grad_accum_for(SimpleNamespace(ranks=[{}] * 4, grad_accum=1), two,
                          SimpleNamespace(batch_size=8, grad_accum=1)) == 2
    assert "resuming a 4-process run with 2: train.grad_accum 1 -> 2 keeps the global batch of 32 sequences" \
        in capsys.readouterr().err
    assert grad_accum_for(SimpleNamespace(ranks=[{}] * 4, grad_accum=2), Distributed(rank=1, world_size=2),
                          SimpleNamespace(batch_size=8, grad_accum=2)) == 4
    assert capsys.readouterr().err == ""  # rank 1 says nothing
    assert grad_accum_for(SimpleNamespace(ranks=[{}] * 2, grad_accum=5), two,
                          SimpleNamespace(batch_size=8, grad_accum=3)) == 3  # the same count: the config's


# ---- torchrun (slow) ---------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(launcher: list[str], overrides: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *launcher, "train.py", "--config", TINY,
                             *overrides], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **popen)


def two_nodes(overrides_a: list[str], overrides_b: list[str]) -> tuple[subprocess.CompletedProcess, ...]:
    """Two torchrun launches of one process each that meet over 127.0.0.1, as two machines would."""
    rendezvous = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=test"]
    nodes = [torchrun(rendezvous, overrides) for overrides in (overrides_a, overrides_b)]
    return tuple(subprocess.CompletedProcess(n.args, n.wait(timeout=240), n.communicate()[0], "") for n in nodes)


def weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model.safetensors"))


MICRO_DDP = ("train.max_iters=20", "train.eval_interval=10", "train.sample_tokens=0", "train.batch_size=4")


@pytest.mark.slow
def test_two_nodes_over_localhost_train_what_one_node_with_two_processes_trains(micro, tmp_path):
    one = torchrun(["--standalone", "--nproc-per-node=2"], micro(*MICRO_DDP, out="one"))
    assert one.wait(timeout=240) == 0, one.communicate()[0][-2000:]
    a, b = two_nodes(micro(*MICRO_DDP, out="two"), micro(*MICRO_DDP, out="two"))
    assert a.returncode == 0 and b.returncode == 0, (a.stdout[-2000:], b.stdout[-2000:])
    w1, w2 = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.slow
def test_a_node_whose_corpus_differs_stops_the_run_naming_it(micro, tmp_path, corpus):
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text(encoding="utf-8").replace("Macbeth", "Macbeht"), encoding="utf-8")
    node_b = [*micro(*MICRO_DDP, out="run"), f"data.source={other}", f"data.cache_dir={tmp_path / 'b-cache'}"]
    a, b = two_nodes(micro(*MICRO_DDP, out="run"), node_b)
    assert a.returncode != 0 and b.returncode != 0
    assert "(rank 1) holds other token files than rank 0" in a.stdout + b.stdout
    assert not (tmp_path / "run" / "trainer_state.pt").exists()  # nothing trained, nothing saved


@pytest.mark.slow
def test_a_node_that_does_not_see_the_checkpoint_stops_the_resume(micro, tmp_path):
    shared = micro(*MICRO_DDP[1:], "train.max_iters=10", out="run")
    a, b = two_nodes(shared, shared)
    assert a.returncode == 0 and b.returncode == 0, (a.stdout[-2000:], b.stdout[-2000:])
    more = micro(*MICRO_DDP[1:], "train.max_iters=20", out="run")
    a, b = two_nodes(more, micro(*MICRO_DDP[1:], "train.max_iters=20", out="elsewhere"))  # node b's own folder
    assert a.returncode != 0 and b.returncode != 0
    said = a.stdout + b.stdout  # (either launch may be rank 0)
    assert "no checkpoint" in said and "iteration 10" in said and "put out_dir on storage every node shares" in said
    assert torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["iteration"] == 10  # untouched


@pytest.mark.slow
@linux_only
def test_a_signal_at_one_process_stops_every_process_with_a_checkpoint(micro, tmp_path):
    """Ctrl-C or SIGTERM reaches one of torchrun's workers (a scheduler may signal one): the
    processes agree on it when they next read the losses, so every process stops after the
    same iteration, rank 0 saves it, and none is left waiting for the others."""
    import signal

    from conftest import Lines

    launcher = torchrun(["--standalone", "--nproc-per-node=2"],
                        micro(*MICRO_DDP[2:], "train.max_iters=100000", "train.checkpoint_interval=100000",
                              "train.eval_interval=100000", "train.log_interval=5", out="run"))
    said = Lines(launcher.stdout)
    workers = []
    try:
        said.wait_for("model: ")  # rank 0's header: the loop has begun, its signal handlers are in place
        workers = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2
        os.kill(int(workers[-1]), signal.SIGTERM)  # one of them only
        launcher.wait(timeout=120)
    finally:
        for pid in [launcher.pid, *map(int, workers)]:  # (a worker left waiting for the other would wait for ever)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    output = said.rest()
    stopped = torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["iteration"]
    assert f"stopped at iteration {stopped}; checkpoint saved" in output and 0 < stopped < 100000, output[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_a_run_continues_with_another_number_of_processes(micro, tmp_path, before, after):
    """Ten steps with `before` processes, ten with `after`: the same global batch (grad_accum
    adjusted) and the same windows, so the weights end as those of twenty steps without the
    change (exactly, here; the order of the sums may differ elsewhere). The schedule is set
    for twenty steps in every run, so that the first run stops half way along it."""
    def run(processes, accum, iters, out):
        settings = [*MICRO_DDP[1:], f"train.max_iters={iters}", f"train.grad_accum={accum}", "train.lr_decay_iters=20"]
        p = torchrun(["--standalone", f"--nproc-per-node={processes}"], micro(*settings, out=out))
        output = p.communicate(timeout=240)[0]
        assert p.returncode == 0, output[-2000:]
        return output

    run(before, 2 // before, 20, "straight")
    run(before, 2 // before, 10, "changed")
    output = run(after, 2 // before, 20, "changed")  # the config still says the old grad_accum
    assert f"resuming a {before}-process run with {after}: train.grad_accum {2 // before} -> {2 // after}" in output
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "changed")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.slow
@linux_only
def test_a_killed_worker_is_replaced_and_the_run_ends_as_if_nothing_happened(tmp_path, corpus):
    overrides = [f"data.source={corpus}", f"data.cache_dir={tmp_path / 'cache'}"]
    assert elastic.trial(tmp_path / "straight", overrides, kill_after=None)["exit"] == 0
    for i in range(5):
        r = elastic.trial(tmp_path / f"killed{i}", overrides)
        assert r["killed"] and r["exit"] == 0, (r, Path(f"{tmp_path / f'killed{i}'}.log").read_text()[-3000:])
        assert r["seconds_after_kill"] < 120
        assert elastic.same_weights(tmp_path / "straight", tmp_path / f"killed{i}")


def test_only_each_nodes_first_process_prepares_the_data(micro, monkeypatch):
    """The others wait at the barrier, then open what it wrote: one progress bar a node."""
    from types import SimpleNamespace

    from jobs import TextJob
    from training import preparation
    from training.config import load_config

    calls, real_prepare = [], TextJob.prepare
    monkeypatch.setattr(TextJob, "prepare", lambda *a, progress, **kw: (calls.append(progress),
                                                                  real_prepare(*a, progress=progress, **kw))[1])
    cfg = load_config(TINY, micro())
    for local_rank in (0, 1):
        node = SimpleNamespace(local_rank=local_rank, nodes=1, is_main=local_rank == 0,
                               barrier=lambda: calls.append("barrier"))
        data, _ = preparation.load_data(cfg, TextJob(cfg.data), node, None)
        assert data.vocab_size > 0
    assert calls == [True, "barrier", "barrier", False]


def test_ddp_wraps_the_model_on_the_cpu(micro):
    """Under torchrun the step runs through DistributedDataParallel (gloo, no device ids on
    a CPU); a group of one process stands in for the others here."""
    from torch.nn.parallel import DistributedDataParallel

    trainer = make_trainer(micro())
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = Distributed(rank=0, world_size=2).wrap(trainer.model, trainer.device)
        assert isinstance(wrapped, DistributedDataParallel) and wrapped.module is trainer.model
    finally:
        dist.destroy_process_group()
