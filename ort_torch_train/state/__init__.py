"""state: the tensors of a training run and everything that replaces them.

``TrainingState`` holds the parameters, their gradients, the optimizer's moments and the properties,
and owns every call that replaces those tensors (``generation`` counts them); ``FlatState`` is the
flat buffers it may move them into, ``ParameterBuffer`` ORT's contiguous parameter copies and
``LossScaler`` fp16's loss scale, kept in the state's properties.
"""

from ort_torch_train.state.optimizer_state import OptimizerState
from ort_torch_train.state.training_state import TrainingState

__all__ = ["OptimizerState", "TrainingState"]
