"""The launcher's rank, local rank and local world size, read in one place (prefzoo/_dist.py)."""

from __future__ import annotations

from prefzoo._dist import is_rank_zero, launcher_rank, local_rank, local_world_size


def test_without_a_launcher_a_process_is_rank_zero_of_one():
    assert launcher_rank({}) == 0 and local_rank({}) == 0 and is_rank_zero({})
    assert local_world_size(env={}) == 1 and local_world_size(4, env={}) == 4
    assert launcher_rank({"RANK": ""}) == 0  # set but empty, as some shells leave it


def test_a_launchers_variables_are_read():
    env = {"RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert launcher_rank(env) == 5 and local_rank(env) == 1 and not is_rank_zero(env)
    assert local_world_size(8, env=env) == 4


def test_the_process_environment_is_the_default(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launcher_rank() == 2 and local_rank() == 0 and not is_rank_zero()
