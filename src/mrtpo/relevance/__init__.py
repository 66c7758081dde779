"""Replay relevance (`replay`); split into one module per idea in the next commit."""

from mrtpo.relevance.replay import (
    _shared_stems,
    build_contexts,
    context_infos,
    js_distance,
    naive_replay_distances,
    replay_distances,
)

__all__ = [
    "_shared_stems",
    "build_contexts",
    "context_infos",
    "js_distance",
    "naive_replay_distances",
    "replay_distances",
]
