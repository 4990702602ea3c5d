"""skyrl_core.peer_rng: a peer that draws from the global RNGs neither moves the process's nor depends on it."""

from __future__ import annotations

import random
import threading

import numpy
from skyrl_core.peer_rng import EpisodeRng, global_rng_kept


def peer_draws() -> tuple[float, float]:
    """What a game library does: draw from the global streams."""
    return random.random(), float(numpy.random.rand())


def test_an_episode_replays_from_its_seed_whatever_the_process_draws_in_between():
    random.seed(1)
    numpy.random.seed(1)
    before = (random.getstate(), numpy.random.get_state()[1].tolist())
    first, second = EpisodeRng(7), EpisodeRng(7)
    with first.active():
        a1 = peer_draws()
    random.random()  # the trainer draws in between; the peers' streams do not move
    with second.active():
        b1 = peer_draws()
    with first.active():
        a2 = peer_draws()
    with second.active():
        b2 = peer_draws()
    assert (a1, a2) == (b1, b2) and a1 != a2  # each episode continues its own stream
    random.seed(1)
    numpy.random.seed(1)
    assert (random.getstate(), numpy.random.get_state()[1].tolist()) == before
    with EpisodeRng(8).active():
        assert peer_draws() != a1


def test_kept_states_undo_what_the_enclosed_code_drew_even_when_it_raises():
    random.seed(3)
    state = random.getstate()
    try:
        with global_rng_kept():
            random.seed(99)
            raise ValueError("peer failed")
    except ValueError:
        pass
    assert random.getstate() == state
    episode = EpisodeRng(5)
    with episode.active():
        with global_rng_kept():  # trying a move on a copy: the episode's stream is not used up
            peer_draws()
        tried = peer_draws()
    with EpisodeRng(5).active():
        assert peer_draws() == tried


def test_threads_take_turns_so_episodes_never_share_a_stream():
    results: dict[int, list[float]] = {}

    def play(index: int) -> None:
        rng = EpisodeRng(11)
        draws = []
        for _ in range(50):
            with rng.active():
                draws.append(random.random())
        results[index] = draws

    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(draws == results[0] for draws in results.values())
