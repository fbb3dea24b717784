"""The zoo's own module types (`privtrain_common.zoo.architectures`) registered with both per-sample engines.

Containers and parameter-free modules (residual blocks, attention, token reshaping) only call
their children or reshape within a row, so both engines take them as structure; the layers with
parameters of their own have rules in `standardised_conv` and `tokens`, and are plain leaves
for the vmap engine (torch.func differentiates any forward).
"""

from __future__ import annotations

from dp.per_example.ghost.support import ghost_container
from dp.per_example.per_sample import supported_module, supported_subtree
from privtrain_common.zoo.architectures import ZOO_CONTAINERS, ZOO_LAYERS, HFImageModel, HFModel

for _container in ZOO_CONTAINERS:
    ghost_container(supported_module(_container))
for _layer in ZOO_LAYERS:
    supported_module(_layer)
supported_subtree(HFModel)
supported_subtree(HFImageModel)
