"""Credit maps: where each reward's advantage lands on the tokens of a response.

A library over given token ids, verdicts, rewards and replay distances: nothing here generates
text, replays or loads a model (`mrtpo.explaining` and the trainer do, and hand the results
over).

- `map`: `CreditMap`, one replayed response with its tokens' character ranges;
- `render`: HTML (escaped), PNG and terminal views of credit maps;
- `analysis`: statistics over many responses (localization table, concentration curves);
- `replay`: maps of replayed rows, distance-only or with their group's advantages;
- `training`: what the trainer writes every `credit_map_steps` steps.
"""

from mrtpo.credit.map import CreditMap, token_offsets
from mrtpo.credit.training import write_training_maps

__all__ = ["CreditMap", "token_offsets", "write_training_maps"]
