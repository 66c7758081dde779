"""Replay relevance: how much each reward's verifier information changes the policy, per token.

The distance of reward k at response token t is the base-2 Jensen-Shannon distance, in [0, 1],
between the next-token distributions after two contexts that differ by reward k's information
(``docs/METHOD.md``, MRTPO, steps 1 and 2). Read in this order:
- `distance`: `js_distance`, and its chunked, cache-blocked use over the replay's states;
- `contexts`: `build_contexts`, the K + 1 contexts of a row from its prompt and information;
- `kv_share`: the caches through which contexts read a shared prompt and shared information
  (the only part coupled to `transformers`' cache classes);
- `replay`: `replay_distances`, the replay with the prompt and shared information run once;
- `naive`: `naive_replay_distances`, every context from scratch, the reference for tests;
- `controls`: the information the controls replay in place of the own (the placebo's, the
  generic text), and how often a placebo text is no placebo (``placebo_shares``).
"""

from mrtpo.relevance.contexts import Contexts, build_contexts, context_infos
from mrtpo.relevance.distance import js_distance
from mrtpo.relevance.naive import naive_replay_distances
from mrtpo.relevance.replay import _shared_stems as _shared_stems  # for the radix-tree test
from mrtpo.relevance.replay import contrastive_replay_distances, replay_distances

__all__ = [
    "Contexts",
    "build_contexts",
    "contrastive_replay_distances",
    "context_infos",
    "js_distance",
    "naive_replay_distances",
    "replay_distances",
]
